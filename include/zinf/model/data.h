// Training data: byte-level text, a built-in default corpus and llm.c token files, cut into
// (inputs, targets) batches that are sharded across ranks deterministically.
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

// An immutable token sequence with its vocabulary size. Copies share the storage (cheap).
class TokenDataset {
 public:
  TokenDataset() = default;

  // `path` is a file or a folder. A folder is read recursively: regular files (symlinks to
  // regular files count, each target once), names sorted bytewise, names starting with '.'
  // skipped, files concatenated with nothing in between. A file that starts with the llm.c
  // magic is a token file (vocab 50257); a file named *.bin must be one; anything else is text,
  // one token per byte (vocab 256). Mixing the two kinds is an error. Errors name the path.
  static Result<TokenDataset> load(const std::string& path);

  // The built-in corpus for `zinf train` without --data: every file under `licenses_dir`
  // (Debian's license texts, ~250 KB), or, when that is missing, unreadable or under 16 KB,
  // generated_corpus() text. Never fails; source() says which was used.
  static TokenDataset load_default(const std::string& licenses_dir = kDefaultCorpusDir);

  static TokenDataset from_text(std::string_view text, std::string source);
  // Fails when a token is >= vocab_size.
  static Result<TokenDataset> from_tokens(std::vector<uint16_t> tokens, int vocab_size,
                                          std::string source);

  int vocab_size() const { return vocab_size_; }
  size_t size() const { return end_ - begin_; }
  std::span<const uint16_t> tokens() const;
  // Where the tokens came from, for logs: "2 files, 12,345 tokens under /data/x".
  const std::string& source() const { return source_; }

  // Tokens [begin, end) (clamped to size()), sharing this dataset's storage; e.g. a validation
  // tail split off a training set.
  TokenDataset slice(size_t begin, size_t end) const;

 private:
  std::shared_ptr<const std::vector<uint16_t>> storage_;
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
