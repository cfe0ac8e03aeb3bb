// TokenDataset formats and errors, the default corpus, and BatchLoader sharding and resume.
#include "zinf/model/data.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "model_test_util.h"

namespace zinf::model {
namespace {

using testing::TempDir;

void write(const std::string& path, std::string_view bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
}

std::string text_of(const TokenDataset& ds) {
  std::string s;
  for (uint32_t t : ds.tokens()) s.push_back(static_cast<char>(t));
  return s;
}

TEST(DataTest, TextFileIsBytes) {
  TempDir dir;
  write(dir.file("a.txt"), std::string("h\xffi\0", 4));
  Result<TokenDataset> ds = TokenDataset::load(dir.file("a.txt"));
  ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
  EXPECT_EQ(ds->vocab_size(), 256);
  EXPECT_EQ(std::vector<uint32_t>(ds->tokens().begin(), ds->tokens().end()),
            (std::vector<uint32_t>{'h', 255, 'i', 0}));
  EXPECT_NE(ds->source().find("a.txt"), std::string::npos);
}

TEST(DataTest, FolderIsSortedRecursiveAndSkipsHiddenAndDuplicates) {
  TempDir dir;
  write(dir.file("b/2.txt"), "B2");
  write(dir.file("b/1.txt"), "B1");
  write(dir.file("a.txt"), "A");
  write(dir.file("c"), "C");
  write(dir.file(".git/objects"), "HIDDEN");
  write(dir.file(".hidden"), "HIDDEN");
  std::filesystem::create_symlink(dir.file("a.txt"), dir.file("0_link_to_a"));  // a.txt is read
  write(dir.file("outside/d.txt"), "D");
  std::filesystem::create_symlink(dir.file("outside/d.txt"), dir.file("b/3"));
  std::filesystem::create_symlink(dir.file("missing"), dir.file("dangling"));
  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0600), 0);
  Result<TokenDataset> ds = TokenDataset::load(dir.path().string());
  ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
  // b/3 links to outside/d.txt, which is also listed: read once, at outside/d.txt.
  EXPECT_EQ(text_of(*ds), "AB1B2CD");
  EXPECT_NE(ds->source().find("5 text files"), std::string::npos) << ds->source();
}

TEST(DataTest, LlmcTokenFileRoundTrip) {
  TempDir dir;
  std::vector<uint16_t> toks = {50256, 0, 1, 2, 50000, 7};
  ASSERT_TRUE(write_llmc_tokens(dir.file("train.bin"), toks).is_ok());
  ASSERT_FALSE(write_llmc_tokens(dir.file("x/more"), std::vector<uint16_t>{9, 9}).is_ok());  // no folder
  std::filesystem::create_directories(dir.file("x"));
  ASSERT_TRUE(write_llmc_tokens(dir.file("x/more"), std::vector<uint16_t>{9, 9}).is_ok());
  Result<TokenDataset> ds = TokenDataset::load(dir.file("train.bin"));
  ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
  EXPECT_EQ(ds->vocab_size(), kGpt2Vocab);
  EXPECT_EQ(std::vector<uint32_t>(ds->tokens().begin(), ds->tokens().end()),
            std::vector<uint32_t>(toks.begin(), toks.end()));
  EXPECT_EQ(std::filesystem::file_size(dir.file("train.bin")), 1024u + 2 * toks.size());
  // A folder of token files concatenates them; "more" is detected by its magic alone.
  Result<TokenDataset> all = TokenDataset::load(dir.path().string());
  ASSERT_TRUE(all.is_ok()) << all.status().to_string();
  EXPECT_EQ(all->size(), toks.size() + 2);
  EXPECT_EQ(all->tokens()[0], 50256);
  EXPECT_EQ(all->tokens().back(), 9);
}

std::string header_bytes(int32_t magic, int32_t version, int32_t ntok) {
  int32_t h[256] = {magic, version, ntok};
  return std::string(reinterpret_cast<const char*>(h), sizeof(h));
}

TEST(DataTest, TokenFileErrorsNameThePath) {
  TempDir dir;
  struct Case {
    std::string name, bytes, expect;
    ErrorCode code;
    DataFormat format = DataFormat::kAuto;
  };
  const std::string two_tokens("\x01\x00\x02\x00", 4);
  const std::vector<Case> cases = {
      {"magic.bin", header_bytes(12345, 1, 2) + two_tokens, "bad magic 12345",
       ErrorCode::kCorruption, DataFormat::kLlmc},
      {"version.bin", header_bytes(kLlmcMagic, 2, 2) + two_tokens, "version 2",
       ErrorCode::kUnsupported},
      {"short.bin", header_bytes(kLlmcMagic, 1, 3) + two_tokens, "header says 3 tokens",
       ErrorCode::kCorruption},
      {"long", header_bytes(kLlmcMagic, 1, 1) + two_tokens, "header says 1 tokens",
       ErrorCode::kCorruption},
      {"header.bin", header_bytes(kLlmcMagic, 1, 0).substr(0, 100),
       "less than the 1024-byte header", ErrorCode::kCorruption},
      {"vocab.bin", header_bytes(kLlmcMagic, 1, 1) + std::string("\xff\xff", 2),
       "token 65535 at byte offset 1024", ErrorCode::kCorruption},
      {"odd.bin", std::string("\x01\x00\x02", 3), "3 bytes is not a whole number of 2-byte uint16",
       ErrorCode::kCorruption},
      {"odd32", std::string(6, '\0'), "6 bytes is not a whole number of 4-byte uint32",
       ErrorCode::kCorruption, DataFormat::kUint32},
      {"huge", std::string("\xff\xff\xff\xff", 4), "token at byte offset 0 is 4294967295",
       ErrorCode::kCorruption, DataFormat::kUint32},
  };
  for (const Case& c : cases) {
    write(dir.file(c.name), c.bytes);
    Result<TokenDataset> ds = TokenDataset::load(dir.file(c.name), c.format);
    ASSERT_FALSE(ds.is_ok()) << c.name;
    EXPECT_EQ(ds.status().code(), c.code) << ds.status().to_string();
    EXPECT_NE(ds.status().message().find(dir.file(c.name)), std::string::npos)
        << ds.status().to_string();
    EXPECT_NE(ds.status().message().find(c.expect), std::string::npos) << ds.status().to_string();
  }
}

// Raw little-endian ids of type Id, no header (nanoGPT's train.bin is uint16).
template <typename Id>
void write_raw(const std::string& path, const std::vector<Id>& ids) {
  write(path, std::string_view(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(Id)));
}

std::vector<uint32_t> ids_of(const TokenDataset& ds) {
  return std::vector<uint32_t>(ds.tokens().begin(), ds.tokens().end());
}

TEST(DataTest, RawUint16File) {
  TempDir dir;
  write_raw<uint16_t>(dir.file("train.bin"), {7, 65535, 0, 300});
  // auto: a *.bin without the llm.c magic is raw uint16; its vocabulary is the largest id + 1.
  for (DataFormat f : {DataFormat::kAuto, DataFormat::kUint16}) {
    Result<TokenDataset> ds = TokenDataset::load(dir.file("train.bin"), f);
    ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
    EXPECT_EQ(ids_of(*ds), (std::vector<uint32_t>{7, 65535, 0, 300}));
    EXPECT_EQ(ds->vocab_size(), 65536);
    EXPECT_NE(ds->source().find("uint16"), std::string::npos) << ds->source();
  }
  // The same bytes as text are bytes; as llm.c they lack the header.
  Result<TokenDataset> text = TokenDataset::load(dir.file("train.bin"), DataFormat::kText);
  ASSERT_TRUE(text.is_ok());
  EXPECT_EQ(text->size(), 8u);
  EXPECT_EQ(text->vocab_size(), 256);
  EXPECT_FALSE(TokenDataset::load(dir.file("train.bin"), DataFormat::kLlmc).is_ok());
}

TEST(DataTest, RawUint32FileKeepsLargeIds) {
  TempDir dir;
  const std::vector<uint32_t> ids = {128000, 65536, 1, 128255, 70000};
  write_raw<uint32_t>(dir.file("llama.u32"), ids);
  Result<TokenDataset> ds = TokenDataset::load(dir.file("llama.u32"), DataFormat::kUint32);
  ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
  EXPECT_EQ(ids_of(*ds), ids);
  EXPECT_EQ(ds->vocab_size(), 128256);
  // auto reads a non-.bin file as text; a .bin as uint16 (halves of each id).
  EXPECT_EQ(testing::must(TokenDataset::load(dir.file("llama.u32"))).vocab_size(), 256);
  write_raw<uint32_t>(dir.file("llama.bin"), ids);
  EXPECT_EQ(testing::must(TokenDataset::load(dir.file("llama.bin"))).size(), 2 * ids.size());
}

TEST(DataTest, AutoDetection) {
  TempDir dir;
  std::filesystem::create_directories(dir.file("a"));
  ASSERT_TRUE(write_llmc_tokens(dir.file("a/llmc.bin"), std::vector<uint16_t>{1, 2}).is_ok());
  write_raw<uint16_t>(dir.file("a/raw.bin"), {60000, 3});
  Result<TokenDataset> llmc = TokenDataset::load(dir.file("a/llmc.bin"));
  ASSERT_TRUE(llmc.is_ok()) << llmc.status().to_string();
  EXPECT_EQ(llmc->vocab_size(), kGpt2Vocab);
  EXPECT_NE(llmc->source().find("llm.c token"), std::string::npos) << llmc->source();
  // A folder may hold llm.c and raw files: the vocabulary covers both.
  Result<TokenDataset> both = TokenDataset::load(dir.file("a"));
  ASSERT_TRUE(both.is_ok()) << both.status().to_string();
  EXPECT_EQ(ids_of(*both), (std::vector<uint32_t>{1, 2, 60000, 3}));
  EXPECT_EQ(both->vocab_size(), 60001);
  write(dir.file("a/notes.txt"), "hi");
  Result<TokenDataset> mixed = TokenDataset::load(dir.file("a"));
  ASSERT_FALSE(mixed.is_ok());
  EXPECT_NE(mixed.status().message().find("cannot mix"), std::string::npos);
  // Forcing a format reads every file that way.
  Result<TokenDataset> as_text = TokenDataset::load(dir.file("a"), DataFormat::kText);
  ASSERT_TRUE(as_text.is_ok()) << as_text.status().to_string();
  EXPECT_EQ(as_text->size(), 1024u + 4 + 4 + 2);
  EXPECT_EQ(parse_data_format("uint32").value(), DataFormat::kUint32);
  EXPECT_EQ(parse_data_format("u32").status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(parse_data_format("u32").status().message().find("'u32'"), std::string::npos);
}

TEST(DataTest, FolderOfRawFilesAndOffsets) {
  TempDir dir;
  write_raw<uint32_t>(dir.file("d/0.bin"), {1, 2, 3});
  write_raw<uint32_t>(dir.file("d/1.bin"), {});
  write_raw<uint32_t>(dir.file("d/2.bin"), {100000, 5});
  Result<TokenDataset> ds = TokenDataset::load(dir.file("d"), DataFormat::kUint32);
  ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
  EXPECT_EQ(ids_of(*ds), (std::vector<uint32_t>{1, 2, 3, 100000, 5}));
  EXPECT_EQ(ds->vocab_size(), 100001);
  EXPECT_EQ(ds->locate(0), dir.file("d/0.bin") + ": token at byte offset 0");
  EXPECT_EQ(ds->locate(2), dir.file("d/0.bin") + ": token at byte offset 8");
  EXPECT_EQ(ds->locate(3), dir.file("d/2.bin") + ": token at byte offset 0");  // past the empty file
  EXPECT_EQ(ds->locate(4), dir.file("d/2.bin") + ": token at byte offset 4");
  EXPECT_EQ(ds->slice(3, 5).locate(1), dir.file("d/2.bin") + ": token at byte offset 4");
  // llm.c offsets count the header; text offsets are byte indices.
  std::filesystem::create_directories(dir.file("l"));
  ASSERT_TRUE(write_llmc_tokens(dir.file("l/x.bin"), std::vector<uint16_t>{4, 5, 6}).is_ok());
  EXPECT_EQ(testing::must(TokenDataset::load(dir.file("l/x.bin"))).locate(2),
            dir.file("l/x.bin") + ": token at byte offset 1028");
  write(dir.file("t/a.txt"), "abc");
  write(dir.file("t/b.txt"), "de");
  EXPECT_EQ(testing::must(TokenDataset::load(dir.file("t"))).locate(4),
            dir.file("t/b.txt") + ": token at byte offset 1");
  EXPECT_EQ(TokenDataset::from_text("xyz", "mem").locate(1), "mem: token 1 (0-based)");
}

TEST(DataTest, PathErrors) {
  TempDir dir;
  Result<TokenDataset> missing = TokenDataset::load(dir.file("nope"));
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(missing.status().message().find(dir.file("nope")), std::string::npos);

  std::filesystem::create_directories(dir.file("empty/sub"));
  write(dir.file("empty/.only_hidden"), "x");
  Result<TokenDataset> empty = TokenDataset::load(dir.file("empty"));
  ASSERT_FALSE(empty.is_ok());
  EXPECT_NE(empty.status().message().find("has no regular files"), std::string::npos);

  write(dir.file("mixed/a.txt"), "text");
  ASSERT_TRUE(write_llmc_tokens(dir.file("mixed/b.bin"), std::vector<uint16_t>{1}).is_ok());
  Result<TokenDataset> mixed = TokenDataset::load(dir.file("mixed"));
  ASSERT_FALSE(mixed.is_ok());
  EXPECT_NE(mixed.status().message().find("cannot mix"), std::string::npos);
}

TEST(DataTest, DefaultCorpus) {
  TokenDataset fallback = TokenDataset::load_default("/nonexistent/zinf/licenses");
  EXPECT_EQ(fallback.vocab_size(), 256);
  EXPECT_GE(fallback.size(), 64u << 10);
  EXPECT_NE(fallback.source().find("generated"), std::string::npos);
  const std::string text = text_of(fallback);
  EXPECT_EQ(text, generated_corpus(64 << 10));  // deterministic
  for (char ch : text) ASSERT_TRUE(ch == '\n' || (ch >= ' ' && ch <= '~')) << int(ch);
  EXPECT_NE(text.find(". "), std::string::npos);

  if (!std::filesystem::is_directory(kDefaultCorpusDir)) GTEST_SKIP() << "no " << kDefaultCorpusDir;
  TokenDataset licenses = TokenDataset::load_default();
  EXPECT_EQ(licenses.vocab_size(), 256);
  EXPECT_GE(licenses.size(), 16u << 10);
  EXPECT_NE(licenses.source().find(kDefaultCorpusDir), std::string::npos) << licenses.source();
}

TEST(DataTest, SliceSharesStorage) {
  TokenDataset ds = TokenDataset::from_text("0123456789", "digits");
  TokenDataset tail = ds.slice(7, 100);
  EXPECT_EQ(text_of(tail), "789");
  EXPECT_EQ(tail.tokens().data(), ds.tokens().data() + 7);
  EXPECT_EQ(text_of(ds.slice(2, 4).slice(1, 2)), "3");
  EXPECT_FALSE(TokenDataset::from_tokens({5, 300}, 256, "x").is_ok());
}

using Rows = std::vector<std::vector<int32_t>>;

// Rows this loader yields over `steps` batches.
Rows take(BatchLoader& loader, int steps) {
  const BatchLoaderOptions& o = loader.options();
  Rows rows;
  std::vector<int32_t> in(o.B * o.T), tgt(o.B * o.T);
  for (int s = 0; s < steps; s++) {
    EXPECT_TRUE(loader.next(in, tgt).is_ok());
    for (int b = 0; b < o.B; b++) {
      rows.emplace_back(in.begin() + b * o.T, in.begin() + (b + 1) * o.T);
      // Targets are the inputs shifted by one token.
      for (int t = 0; t + 1 < o.T; t++) EXPECT_EQ(tgt[b * o.T + t], in[b * o.T + t + 1]);
    }
  }
  return rows;
}

TokenDataset counting_dataset(size_t n) {
  std::vector<uint32_t> t(n);
  for (size_t i = 0; i < n; i++) t[i] = static_cast<uint16_t>(i);
  return testing::must(TokenDataset::from_tokens(t, 65536, "counting"));
}

TEST(BatchLoaderTest, RanksTogetherSeeTheSingleRankBatch) {
  TokenDataset ds = counting_dataset(8 * 13 + 1);  // 13 rows of T = 8: epochs roll mid-batch
  for (int W : {2, 3, 4}) {
    BatchLoaderOptions one{.B = 2 * W, .T = 8, .rank = 0, .world_size = 1, .seed = 5};
    BatchLoader single = testing::must(BatchLoader::create(ds, one));
    Rows global = take(single, 7);
    std::vector<Rows> per_rank;
    for (int r = 0; r < W; r++) {
      BatchLoaderOptions o{.B = 2, .T = 8, .rank = r, .world_size = W, .seed = 5};
      BatchLoader l = testing::must(BatchLoader::create(ds, o));
      per_rank.push_back(take(l, 7));
      EXPECT_EQ(l.position(), single.position());
    }
    for (int s = 0; s < 7; s++) {
      for (int r = 0; r < W; r++) {
        for (int b = 0; b < 2; b++) {
          ASSERT_EQ(per_rank[r][s * 2 + b], global[s * 2 * W + r * 2 + b]) << W << " " << s;
        }
      }
    }
  }
}

TEST(BatchLoaderTest, EpochsArePermutationsAndSeedsDiffer) {
  TokenDataset ds = counting_dataset(4 * 50 + 1);
  BatchLoader a = testing::must(BatchLoader::create(ds, {.B = 5, .T = 4, .seed = 1}));
  BatchLoader b = testing::must(BatchLoader::create(ds, {.B = 5, .T = 4, .seed = 2}));
  EXPECT_EQ(a.rows_per_epoch(), 50u);
  Rows ra = take(a, 20), rb = take(b, 20);  // two epochs
  EXPECT_NE(ra, rb);
  for (int e = 0; e < 2; e++) {
    std::set<int32_t> starts;
    for (int i = 0; i < 50; i++) starts.insert(ra[e * 50 + i][0]);
    EXPECT_EQ(starts.size(), 50u);  // every row once
    EXPECT_EQ(*starts.rbegin(), 49 * 4);
  }
  EXPECT_NE(Rows(ra.begin(), ra.begin() + 50), Rows(ra.begin() + 50, ra.end()));
  EXPECT_EQ(a.position(), (BatchPosition{2, 0}));
}

TEST(BatchLoaderTest, RestoreContinuesExactly) {
  TokenDataset ds = counting_dataset(6 * 17 + 3);
  BatchLoaderOptions o{.B = 3, .T = 6, .rank = 1, .world_size = 2, .seed = 9};
  BatchLoader a = testing::must(BatchLoader::create(ds, o));
  take(a, 4);
  BatchPosition saved = a.position();
  Rows expected = take(a, 6);
  BatchLoader b = testing::must(BatchLoader::create(ds, o));
  ASSERT_TRUE(b.restore(saved).is_ok());
  EXPECT_EQ(take(b, 6), expected);
  EXPECT_FALSE(b.restore({0, 17}).is_ok());
}

TEST(BatchLoaderTest, UnshuffledIsDatasetOrder) {
  TokenDataset ds = counting_dataset(3 * 4 + 1);
  BatchLoader l = testing::must(BatchLoader::create(ds, {.B = 1, .T = 3, .shuffle = false}));
  Rows r = take(l, 5);
  EXPECT_EQ(r[0], (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(r[3], (std::vector<int32_t>{9, 10, 11}));
  EXPECT_EQ(r[4], (std::vector<int32_t>{0, 1, 2}));  // next epoch
}

TEST(BatchLoaderTest, Errors) {
  TokenDataset ds = counting_dataset(10);
  EXPECT_NE(BatchLoader::create(ds, {.B = 1, .T = 10}).status().message().find("at least 11"),
            std::string::npos);
  EXPECT_FALSE(BatchLoader::create(ds, {.B = 0, .T = 4}).is_ok());
  EXPECT_FALSE(BatchLoader::create(ds, {.B = 1, .T = 4, .rank = 2, .world_size = 2}).is_ok());
  BatchLoader l = testing::must(BatchLoader::create(ds, {.B = 1, .T = 9}));
  std::vector<int32_t> small(3);
  EXPECT_FALSE(l.next(small, small).is_ok());
}

}  // namespace
}  // namespace zinf::model
