// zinf train: what decides a run's data order (seed, data, batch geometry) and where its data
// loader stands, kept in a checkpoint's client_state so that --resume continues the same run.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "zinf/model/data.h"
#include "zinf/status.h"

namespace zinf::cli {

// The data a run trains on. Two datasets are the same data when their token count, vocabulary
// and content hash agree; `path` is where to read it again, `source` names it in messages.
struct DataIdentity {
  std::string path;  // absolute --data path; empty: the built-in corpus
  std::string source;
  std::uint64_t tokens = 0;
  int vocab = 0;
  std::uint64_t hash = 0;  // content_hash() of the tokens
  std::string format = "auto";  // the --data-format it was read with (data_format_name)

  bool same_data(const DataIdentity& other) const {
    return tokens == other.tokens && vocab == other.vocab && hash == other.hash;
  }
  // "/data/x.txt (1 text file, 35149 tokens from x.txt; 35149 tokens, vocab 256, hash 0f3a...)"
  std::string describe() const;
};

// 64-bit hash of the token values, a few GB/s: it tells one data file from another (it is not
// meant to resist deliberate collisions).
// Data whose ids are all below 65536 hashes as it did when tokens were held as uint16.
std::uint64_t content_hash(std::span<const std::uint32_t> tokens);
// `path` is the --data argument as given (empty: the built-in corpus); it is stored absolute.
DataIdentity identify_data(const model::TokenDataset& data, const std::string& path,
                           model::DataFormat format = model::DataFormat::kAuto);

// How the loader cuts the data into steps.
struct BatchGeometry {
  int micro_batch = 0;  // rows per rank per micro-batch
  int seq = 0;          // tokens per row
  int grad_accum = 0;   // micro-batches per optimizer step
  int world_size = 0;   // data-parallel ranks
  // Rows of the data each optimizer step consumes, on all ranks together.
  std::uint64_t rows_per_step() const {
    return static_cast<std::uint64_t>(micro_batch) * static_cast<std::uint64_t>(grad_accum) *
           static_cast<std::uint64_t>(world_size);
  }
};

// Everything a checkpoint records about the run's data, as client_state JSON. The loader's
// position counts rows of the global batch (B * W rows per micro-batch, the same on every rank),
// so it means the same thing at any world size: resumed on W' ranks with the same
// train_batch_size, the run sees exactly the rows an uninterrupted one would have.
struct RunState {
  std::uint64_t seed = 0;
  DataIdentity data;
  BatchGeometry batch;  // batch.seq is the training window
  model::BatchPosition position;
  // The dtype of the Hugging Face folder the run started from (torch's name, "bfloat16"), which
  // `zinf consolidate --hf` writes by default; empty when it did not start from one.
  std::string source_dtype;
};
std::string run_state_json(const RunState& state);
// The source_dtype a checkpoint's client_state records, or "" (none, or not readable).
std::string source_dtype_of(const std::string& client_state);

// What to do when the resumed run's seed, data or batch differ from the checkpoint's.
struct ResumeRules {
  bool allow_data_change = false;  // --allow-data-change: accept with a warning
  bool speaker = true;             // this rank logs the warnings (rank 0)
};

// A checkpoint's record of its run, read before the engine is built. Checkpoints written before
// zinf saved the seed, the data or the full batch geometry lack those fields (nullopt); resuming
// from one keeps the command line's values, with a warning.
class SavedRun {
 public:
  // Reads <dir>/latest and that tag's engine.json. Errors name the folder.
  static Result<SavedRun> read(const std::string& dir);

  const std::string& tag() const { return tag_; }
  const std::string& folder() const { return folder_; }  // <dir>/<tag>

  // The seed of the data order: the checkpoint's. A --seed that differs is an error naming
  // both, or with allow_data_change a warning and the given seed.
  Result<std::uint64_t> seed(std::optional<std::uint64_t> given, std::uint64_t fallback,
                             const ResumeRules& rules) const;
  // The --data path to read: `given` when not empty, else the checkpoint's (empty: the built-in
  // corpus; an older checkpoint without a record: the built-in corpus, as before).
  std::string data_path(const std::string& given) const;
  // How to read it: `given` (--data-format) when set, else the checkpoint's, else auto.
  Result<model::DataFormat> data_format(std::optional<model::DataFormat> given) const;
  // The data actually read must be the checkpoint's; `given` says whether --data named it.
  // Returns whether it differs (allowed by allow_data_change, with a warning).
  Result<bool> check_data(const DataIdentity& now, bool given, const ResumeRules& rules) const;
  // The batch geometry: a different window (--seq) or different rows per step on the same world
  // size are errors unless allow_data_change (then warnings); another world size a warning when
  // it changes the rows per step.
  Status check_batch(const BatchGeometry& now, const ResumeRules& rules) const;
  // The window the checkpoint trained (its rows' tokens), when it records one.
  std::optional<int> seq() const { return batch_ ? std::optional<int>(batch_->seq) : std::nullopt; }
  // What the checkpoint's run started from (RunState::source_dtype).
  const std::string& source_dtype() const { return source_dtype_; }
  // Puts the loader where the checkpoint's stood. When the data changed (check_data) and the
  // position is past the new data's epoch, the next epoch starts from its first row. When the
  // window changed (now_seq; allowed by check_batch), the run goes on from the same share of the
  // epoch, in rows of the new window.
  Status restore_position(model::BatchLoader& loader, bool data_changed, int now_seq, const ResumeRules& rules) const;

  int world_size() const { return world_size_; }
  // The model the checkpoint was saved from (its config_json(); empty if engine.json has none).
  const std::string& model_json() const { return model_json_; }

 private:
  std::string dir_, tag_, folder_, model_json_, source_dtype_;
  model::BatchPosition position_;
  std::optional<std::uint64_t> seed_;
  std::optional<DataIdentity> data_;
  std::optional<BatchGeometry> batch_;   // all four fields (newer checkpoints)
  std::optional<std::uint64_t> rows_per_step_;
  int world_size_ = 1;
};

}  // namespace zinf::cli
