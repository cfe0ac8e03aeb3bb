// Training data: byte-level text, a built-in default corpus, llm.c token files and raw uint16 /
// uint32 token files, cut into (inputs, targets) batches sharded across ranks deterministically.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/status.h"

namespace zinf::model {

inline constexpr int kByteVocab = 256;    // text read as bytes
inline constexpr int kGpt2Vocab = 50257;  // llm.c token files (GPT-2 BPE)
inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int32_t kLlmcVersion = 1;
inline constexpr int kLlmcHeaderInts = 256;  // header: 256 int32, then uint16 tokens
inline constexpr const char* kDefaultCorpusDir = "/usr/share/common-licenses";
// The largest token id a dataset may hold: ids travel as int32 and vocab_size() is an int.
inline constexpr uint32_t kMaxTokenId = 0x7ffffffe;

// How the files of a dataset are read (`--data-format`).
enum class DataFormat {
  kAuto,    // per file: the llm.c magic -> kLlmc; a *.bin without it -> kUint16; else kText
  kText,    // one token per byte, vocab 256
  kLlmc,    // llm.c: 1024-byte header (int32 magic, version 1, count), then uint16 tokens
  kUint16,  // raw little-endian uint16 ids, no header (nanoGPT's train.bin)
  kUint32,  // raw little-endian uint32 ids, no header (vocabularies over 65535)
};
// "auto", "text", "llmc", "uint16", "uint32"; anything else is an invalid_argument naming it.
Result<DataFormat> parse_data_format(std::string_view name);
const char* data_format_name(DataFormat format);

// An immutable token sequence with its vocabulary size. Copies share the storage (cheap).
// Ids are held as uint32 whatever the file's width (4 bytes a token in memory, twice a uint16
// file's size): one element type keeps tokens() a plain span for every caller, and the whole
// dataset is read into memory as before, so a corpus must fit in RAM at 4 bytes a token.
class TokenDataset {
 public:
  TokenDataset() = default;

  // `path` is a file or a folder. A folder is read recursively: regular files (symlinks to
  // regular files count, each target once), names sorted bytewise, names starting with '.'
  // skipped, files concatenated with nothing in between. `format` says how every file is read;
  // kAuto decides per file (see DataFormat; a *.bin read as raw uint16 is logged as a note).
  // Vocabulary: text 256; llm.c 50257 (ids checked below it); raw files the largest id + 1
  // (with llm.c files in the same dataset, at least 50257). Mixing text and token files is an
  // error. A raw file whose size is not a multiple of its id width is an error. Errors name the
  // path.
  static Result<TokenDataset> load(const std::string& path, DataFormat format = DataFormat::kAuto);

  // The built-in corpus for `zinf train` without --data: every file under `licenses_dir`
  // (Debian's license texts, ~250 KB), or, when that is missing, unreadable or under 16 KB,
  // generated_corpus() text. Never fails; source() says which was used.
  static TokenDataset load_default(const std::string& licenses_dir = kDefaultCorpusDir);

  static TokenDataset from_text(std::string_view text, std::string source);
  // Fails when a token is >= vocab_size or vocab_size is not in [1, kMaxTokenId + 1].
  static Result<TokenDataset> from_tokens(std::vector<uint32_t> tokens, int vocab_size,
                                          std::string source);

  int vocab_size() const { return vocab_size_; }
  size_t size() const { return end_ - begin_; }
  std::span<const uint32_t> tokens() const;
  // Where the tokens came from, for logs: "2 files, 12,345 tokens under /data/x".
  const std::string& source() const { return source_; }
  // Where token `index` (0-based within this dataset or slice) was read, for errors:
  // "corpus/train.bin: token at byte offset 1048576" (the offset counts any header), or for
  // in-memory data "<source>: token 12 (0-based)". index must be below size().
  std::string locate(size_t index) const;
  // Every id among the first `count` tokens (all when count >= size()) is below `vocab`; else
  // InvalidArgument naming the first that is not by locate(): "x.bin: token at byte offset 200
  // is 128300, outside the model's vocabulary of 256".
  Status check_ids_below(uint32_t vocab, size_t count = SIZE_MAX) const;

  // Tokens [begin, end) (clamped to size()), sharing this dataset's storage; e.g. a validation
  // tail split off a training set.
  TokenDataset slice(size_t begin, size_t end) const;

 private:
  // One row per file read, by first token: token i of storage_ lies in the last row whose
  // first_token <= i, at byte header_bytes + (i - first_token) * element_bytes of path.
  struct FileSpan {
    size_t first_token = 0;
    std::string path;
    uint64_t header_bytes = 0;
    uint32_t element_bytes = 1;
  };
  friend class DatasetBuilder;

  std::shared_ptr<const std::vector<uint32_t>> storage_;
  std::shared_ptr<const std::vector<FileSpan>> files_;  // empty for in-memory data
  size_t begin_ = 0;
  size_t end_ = 0;
  int vocab_size_ = kByteVocab;
  std::string source_;
};

// Deterministic English-like sentences, at least `min_bytes` long (the fallback default corpus).
std::string generated_corpus(size_t min_bytes);

// Writes an llm.c token file (header: magic, version 1, token count; then uint16 tokens).
Status write_llmc_tokens(const std::string& path, std::span<const uint16_t> tokens);

// Where a BatchLoader stands: the epoch and the next row of that epoch's order. Save it in a
// checkpoint and restore() it to continue with exactly the batches that would have come next.
struct BatchPosition {
  uint64_t epoch = 0;
  uint64_t row = 0;
  bool operator==(const BatchPosition&) const = default;
};

struct BatchLoaderOptions {
  int B = 1;   // rows per rank (micro-batch)
  int T = 64;  // tokens per row
  int rank = 0;
  int world_size = 1;
  uint64_t seed = 0;    // order of rows within each epoch
  bool shuffle = true;  // false: rows in dataset order (evaluation)
};

// Cuts the dataset into rows of T+1 tokens: row w is tokens [w*T, w*T + T + 1) (inputs are the
// first T, targets the last T), so an epoch has (size - 1) / T rows. Each epoch visits every
// row once in an order drawn from (seed, epoch). A step consumes one global batch of
// B * world_size rows; rank r gets rows [r*B, (r+1)*B) of it, so W ranks together see exactly
// the batch one rank with B*W rows would see. Epochs roll over inside a batch if need be.
// Not thread-safe.
class BatchLoader {
 public:
  // Fails when B, T, rank or world_size are out of range or the dataset has fewer than T+1 tokens.
  static Result<BatchLoader> create(TokenDataset data, const BatchLoaderOptions& options);

  // Fills this rank's (B, T) inputs and targets and advances by one global batch.
  Status next(std::span<int32_t> inputs, std::span<int32_t> targets);

  BatchPosition position() const { return pos_; }
  // Fails when row is not below rows_per_epoch().
  Status restore(BatchPosition position);
  uint64_t rows_per_epoch() const { return rows_; }
  const TokenDataset& dataset() const { return data_; }
  const BatchLoaderOptions& options() const { return opt_; }

 private:
  BatchLoader(TokenDataset data, const BatchLoaderOptions& options);
  uint64_t row_start(uint64_t epoch, uint64_t row);  // token offset of a row

  TokenDataset data_;
  BatchLoaderOptions opt_;
  uint64_t rows_ = 0;
  BatchPosition pos_;
  uint64_t order_epoch_ = UINT64_MAX;  // epoch whose permutation order_ holds
  std::vector<uint32_t> order_;
};

}  // namespace zinf::model
