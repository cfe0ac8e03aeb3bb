// TokenDataset loading (text, folders, llm.c token files) and the sharded BatchLoader.
#include "zinf/model/data.h"

#include <fcntl.h>
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <filesystem>
#include <set>

#include "common/file_io.h"
#include "model/rng.h"
#include "zinf/log.h"

namespace zinf::model {

static_assert(std::endian::native == std::endian::little,
              "llm.c token files are little-endian; add byte swapping for this host");

namespace fs = std::filesystem;

namespace {

using fileio::UniqueFd;

// Reads exactly n bytes at offset (the common toolkit: short reads, EINTR, the end of the file).
Status read_exact(int fd, const std::string& path, void* buf, size_t n, uint64_t offset) {
  return fileio::pread_exact(fd, path, buf, n, offset);
}

// The concrete format of one file: `format` unless it is kAuto, else decided by its first bytes
// and name.
DataFormat resolve_format(DataFormat format, const std::string& path, int32_t magic) {
  if (format != DataFormat::kAuto) return format;
  if (magic == kLlmcMagic) return DataFormat::kLlmc;
  if (fs::path(path).extension() == ".bin") return DataFormat::kUint16;
  return DataFormat::kText;
}

}  // namespace

// Accumulates files into one token sequence with its per-file table (a friend of TokenDataset).
class DatasetBuilder {
 public:
  Status append_file(const std::string& path, DataFormat format);
  Result<TokenDataset> finish(const std::string& where);

 private:
  Status append_llmc(int fd, const std::string& path, uint64_t size);
  template <typename Id>
  Status append_raw(int fd, const std::string& path, uint64_t size);
  Status append_text(int fd, const std::string& path, uint64_t size);

  std::vector<uint32_t> tokens_;
  std::vector<TokenDataset::FileSpan> files_;
  std::string first_text_, first_tokens_;  // first file of each kind, for the mixing error
  std::set<DataFormat> formats_;
  uint32_t max_raw_id_ = 0;  // largest id read from a raw file
  bool any_raw_ = false;
  size_t guessed_raw_ = 0;  // *.bin files that kAuto read as raw uint16
  std::string first_guessed_raw_;
};

Status DatasetBuilder::append_llmc(int fd, const std::string& path, uint64_t size) {
  int32_t header[kLlmcHeaderInts];
  if (size < sizeof(header)) {
    return Status::corruption(
        fmt::format("{}: truncated llm.c token file: {} bytes, less than the {}-byte header", path,
                    size, sizeof(header)));
  }
  ZINF_RETURN_IF_ERROR(read_exact(fd, path, header, sizeof(header), 0));
  if (header[0] != kLlmcMagic) {
    return Status::corruption(fmt::format(
        "{}: bad magic {} for an llm.c token file (expected {}; Llama-3 files with uint32 "
        "tokens, magic 20240801, are not supported; raw files take --data-format uint16 or "
        "uint32)",
        path, header[0], kLlmcMagic));
  }
  if (header[1] != kLlmcVersion) {
    return Status::unsupported(
        fmt::format("{}: llm.c token file version {} is not supported (expected {})", path,
                    header[1], kLlmcVersion));
  }
  const int64_t ntok = header[2];
  const uint64_t expected = sizeof(header) + 2 * static_cast<uint64_t>(std::max<int64_t>(ntok, 0));
  if (ntok < 0 || size != expected) {
    return Status::corruption(fmt::format(
        "{}: llm.c token file header says {} tokens ({} bytes in all) but the file has {} bytes",
        path, ntok, expected, size));
  }
  std::vector<uint16_t> ids(static_cast<size_t>(ntok));
  ZINF_RETURN_IF_ERROR(read_exact(fd, path, ids.data(), 2 * ids.size(), sizeof(header)));
  for (size_t i = 0; i < ids.size(); i++) {
    if (ids[i] >= kGpt2Vocab) {
      return Status::corruption(
          fmt::format("{}: token {} at byte offset {} is not below the llm.c vocabulary {}", path,
                      ids[i], sizeof(header) + 2 * i, kGpt2Vocab));
    }
  }
  files_.push_back({tokens_.size(), path, sizeof(header), 2});
  tokens_.insert(tokens_.end(), ids.begin(), ids.end());
  return Status::ok();
}

// Raw little-endian ids of type Id, no header, read in 1 MiB chunks.
template <typename Id>
Status DatasetBuilder::append_raw(int fd, const std::string& path, uint64_t size) {
  if (size % sizeof(Id) != 0) {
    return Status::corruption(
        fmt::format("{}: {} bytes is not a whole number of {}-byte uint{} tokens", path, size,
                    sizeof(Id), 8 * sizeof(Id)));
  }
  files_.push_back({tokens_.size(), path, 0, sizeof(Id)});
  tokens_.reserve(tokens_.size() + size / sizeof(Id));
  std::vector<Id> chunk(std::min<uint64_t>(size / sizeof(Id), (1 << 20) / sizeof(Id)));
  for (uint64_t off = 0; off < size; off += chunk.size() * sizeof(Id)) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), (size - off) / sizeof(Id)));
    ZINF_RETURN_IF_ERROR(read_exact(fd, path, chunk.data(), n * sizeof(Id), off));
    for (size_t i = 0; i < n; i++) {
      if (chunk[i] > kMaxTokenId) {
        return Status::corruption(
            fmt::format("{}: token at byte offset {} is {}, above the largest supported id {}",
                        path, off + i * sizeof(Id), static_cast<uint64_t>(chunk[i]), kMaxTokenId));
      }
      max_raw_id_ = std::max<uint32_t>(max_raw_id_, chunk[i]);
    }
    tokens_.insert(tokens_.end(), chunk.begin(), chunk.begin() + n);
  }
  any_raw_ = true;
  return Status::ok();
}

Status DatasetBuilder::append_text(int fd, const std::string& path, uint64_t size) {
  files_.push_back({tokens_.size(), path, 0, 1});
  std::vector<uint8_t> chunk(std::min<uint64_t>(size, 1 << 20));
  tokens_.reserve(tokens_.size() + size);
  for (uint64_t off = 0; off < size; off += chunk.size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), size - off));
    ZINF_RETURN_IF_ERROR(read_exact(fd, path, chunk.data(), n, off));
    tokens_.insert(tokens_.end(), chunk.begin(), chunk.begin() + n);
  }
  return Status::ok();
}

Status DatasetBuilder::append_file(const std::string& path, DataFormat format) {
  ZINF_ASSIGN_OR_RETURN(UniqueFd fd, fileio::open_file(path, O_RDONLY, 0, "reading"));
  ZINF_ASSIGN_OR_RETURN(const uint64_t size, fileio::file_size(fd.get(), path));
  int32_t magic = 0;
  if (format == DataFormat::kAuto && size >= sizeof(magic)) {
    ZINF_RETURN_IF_ERROR(read_exact(fd.get(), path, &magic, 4, 0));
  }
  const DataFormat resolved = resolve_format(format, path, magic);
  if (format == DataFormat::kAuto && resolved == DataFormat::kUint16 && guessed_raw_++ == 0) {
    first_guessed_raw_ = path;
  }
  const bool text = resolved == DataFormat::kText;
  std::string& first = text ? first_text_ : first_tokens_;
  if (first.empty()) first = path;
  if (!first_tokens_.empty() && !first_text_.empty()) {
    return Status::invalid_argument(
        fmt::format("cannot mix text ({}) and token files ({}) in one dataset", first_text_,
                    first_tokens_));
  }
  formats_.insert(resolved);
  switch (resolved) {
    case DataFormat::kLlmc: return append_llmc(fd.get(), path, size);
    case DataFormat::kUint16: return append_raw<uint16_t>(fd.get(), path, size);
    case DataFormat::kUint32: return append_raw<uint32_t>(fd.get(), path, size);
    default: return append_text(fd.get(), path, size);
  }
}

Result<TokenDataset> DatasetBuilder::finish(const std::string& where) {
  if (guessed_raw_ > 0) {
    log(LogLevel::kInfo,
        fmt::format("note: {}{} without an llm.c header read as raw little-endian uint16 tokens "
                    "(nanoGPT); give --data-format uint32 for 32-bit ids",
                    first_guessed_raw_,
                    guessed_raw_ == 1 ? "" : fmt::format(" and {} more *.bin files", guessed_raw_ - 1)));
  }
  int vocab = kByteVocab;
  if (formats_.count(DataFormat::kLlmc) != 0) vocab = kGpt2Vocab;
  if (any_raw_) vocab = std::max(vocab, static_cast<int>(max_raw_id_) + 1);
  std::string kinds;
  for (DataFormat f : formats_) {
    kinds += kinds.empty() ? "" : "+";
    kinds += f == DataFormat::kText ? "text" : f == DataFormat::kLlmc ? "llm.c token" : data_format_name(f);
  }
  std::string source = fmt::format("{} {} file{}, {} tokens{}", files_.size(), kinds,
                                   files_.size() == 1 ? "" : "s", tokens_.size(), where);
  ZINF_ASSIGN_OR_RETURN(TokenDataset ds,
                        TokenDataset::from_tokens(std::move(tokens_), vocab, std::move(source)));
  ds.files_ = std::make_shared<const std::vector<TokenDataset::FileSpan>>(std::move(files_));
  return ds;
}

namespace {

// Regular files under dir, sorted, each real file once, hidden names skipped.
Result<std::vector<std::string>> list_files(const std::string& dir) {
  std::vector<std::string> paths;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec);
  if (ec) return Status::sys_error("list " + dir, ec.value());
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) return Status::sys_error("list " + dir, ec.value());
    const std::string name = it->path().filename().string();
    if (!name.empty() && name[0] == '.') {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file(ec)) paths.push_back(it->path().string());
  }
  if (ec) return Status::sys_error("list " + dir, ec.value());
  std::sort(paths.begin(), paths.end());
  // Each real file once, at its own name when it is listed, else at its first link's name.
  std::vector<std::string> real(paths.size());
  std::set<std::string> listed_directly;
  for (size_t i = 0; i < paths.size(); i++) {
    fs::path r = fs::canonical(paths[i], ec);
    real[i] = ec ? paths[i] : r.string();
    if (!fs::is_symlink(paths[i], ec)) listed_directly.insert(real[i]);
  }
  std::vector<std::string> unique;
  std::set<std::string> seen;
  for (size_t i = 0; i < paths.size(); i++) {
    const bool link = fs::is_symlink(paths[i], ec);
    if (link && listed_directly.count(real[i]) != 0) continue;
    if (seen.insert(real[i]).second) unique.push_back(paths[i]);
  }
  return unique;
}

Result<TokenDataset> load_files(const std::vector<std::string>& files, const std::string& where,
                                DataFormat format) {
  DatasetBuilder builder;
  for (const std::string& f : files) ZINF_RETURN_IF_ERROR(builder.append_file(f, format));
  return builder.finish(where);
}

}  // namespace

Result<DataFormat> parse_data_format(std::string_view name) {
  for (DataFormat f : {DataFormat::kAuto, DataFormat::kText, DataFormat::kLlmc, DataFormat::kUint16,
                       DataFormat::kUint32}) {
    if (name == data_format_name(f)) return f;
  }
  return Status::invalid_argument(fmt::format(
      "data format '{}' is not one of auto, text, llmc, uint16, uint32", name));
}

const char* data_format_name(DataFormat format) {
  switch (format) {
    case DataFormat::kAuto: return "auto";
    case DataFormat::kText: return "text";
    case DataFormat::kLlmc: return "llmc";
    case DataFormat::kUint16: return "uint16";
    case DataFormat::kUint32: return "uint32";
  }
  return "?";
}

Result<TokenDataset> TokenDataset::load(const std::string& path, DataFormat format) {
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) {
    return Status::not_found(fmt::format("data path {}: No such file or directory", path));
  }
  if (fs::is_directory(st)) {
    ZINF_ASSIGN_OR_RETURN(std::vector<std::string> files, list_files(path));
    if (files.empty()) {
      return Status::invalid_argument(fmt::format("data folder {} has no regular files", path));
    }
    return load_files(files, " under " + path, format);
  }
  if (!fs::is_regular_file(st)) {
    return Status::invalid_argument(fmt::format("data path {} is not a file or folder", path));
  }
  return load_files({path}, " from " + path, format);
}

TokenDataset TokenDataset::load_default(const std::string& licenses_dir) {
  constexpr size_t kMinBytes = 16 << 10;
  std::error_code ec;
  if (fs::is_directory(licenses_dir, ec)) {
    Result<std::vector<std::string>> files = list_files(licenses_dir);
    if (files.is_ok() && !files->empty()) {
      Result<TokenDataset> ds = load_files(*files, " under " + licenses_dir, DataFormat::kText);
      if (ds.is_ok() && ds->vocab_size() == kByteVocab && ds->size() >= kMinBytes) {
        ds->source_ = "default corpus: " + ds->source_;
        return std::move(ds).value();
      }
    }
  }
  log_once(
      LogLevel::kInfo, "zinf.model.generated_corpus",
      fmt::format("default corpus: no usable texts under {}; using generated text", licenses_dir));
  std::string text = generated_corpus(64 << 10);
  const size_t n = text.size();
  return from_text(text, fmt::format("default corpus: generated text, {} tokens", n));
}

TokenDataset TokenDataset::from_text(std::string_view text, std::string source) {
  std::vector<uint32_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); i++) tokens[i] = static_cast<unsigned char>(text[i]);
  TokenDataset ds;
  ds.end_ = tokens.size();
  ds.storage_ = std::make_shared<const std::vector<uint32_t>>(std::move(tokens));
  ds.vocab_size_ = kByteVocab;
  ds.source_ = std::move(source);
  return ds;
}

Result<TokenDataset> TokenDataset::from_tokens(std::vector<uint32_t> tokens, int vocab_size,
                                               std::string source) {
  if (vocab_size < 1 || static_cast<uint64_t>(vocab_size) > uint64_t{kMaxTokenId} + 1) {
    return Status::invalid_argument(fmt::format("vocab_size ({}) must be between 1 and {}",
                                                vocab_size, uint64_t{kMaxTokenId} + 1));
  }
  for (size_t i = 0; i < tokens.size(); i++) {
    if (tokens[i] >= static_cast<uint32_t>(vocab_size)) {
      return Status::invalid_argument(fmt::format("{}: token {} at position {} is not below {}",
                                                  source, tokens[i], i, vocab_size));
    }
  }
  TokenDataset ds;
  ds.end_ = tokens.size();
  ds.storage_ = std::make_shared<const std::vector<uint32_t>>(std::move(tokens));
  ds.vocab_size_ = vocab_size;
  ds.source_ = std::move(source);
  return ds;
}

std::span<const uint32_t> TokenDataset::tokens() const {
  if (!storage_) return {};
  return std::span<const uint32_t>(*storage_).subspan(begin_, end_ - begin_);
}

Status TokenDataset::check_ids_below(uint32_t vocab, size_t count) const {
  const std::span<const uint32_t> ids = tokens().first(std::min(count, size()));
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= vocab) {
      return Status::invalid_argument(
          fmt::format("{} is {}, outside the model's vocabulary of {}", locate(i), ids[i], vocab));
    }
  }
  return Status::ok();
}

std::string TokenDataset::locate(size_t index) const {
  const size_t i = begin_ + index;
  if (!files_ || files_->empty()) return fmt::format("{}: token {} (0-based)", source_, index);
  // The last file that starts at or before token i (empty files share a first_token).
  auto it = std::upper_bound(files_->begin(), files_->end(), i,
                             [](size_t t, const FileSpan& f) { return t < f.first_token; });
  const FileSpan& f = *std::prev(it);
  return fmt::format("{}: token at byte offset {}", f.path,
                     f.header_bytes + uint64_t{f.element_bytes} * (i - f.first_token));
}

TokenDataset TokenDataset::slice(size_t begin, size_t end) const {
  TokenDataset ds = *this;
  end = std::min(end, size());
  begin = std::min(begin, end);
  ds.begin_ = begin_ + begin;
  ds.end_ = begin_ + end;
  ds.source_ = fmt::format("{} [{}, {})", source_, begin, end);
  return ds;
}

Status write_llmc_tokens(const std::string& path, std::span<const uint16_t> tokens) {
  if (tokens.size() > static_cast<size_t>(INT32_MAX)) {
    return Status::invalid_argument(
        fmt::format("{}: {} tokens do not fit an llm.c header", path, tokens.size()));
  }
  int32_t header[kLlmcHeaderInts] = {};
  header[0] = kLlmcMagic;
  header[1] = kLlmcVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  ZINF_ASSIGN_OR_RETURN(UniqueFd fd, fileio::open_file(path, O_WRONLY | O_CREAT | O_TRUNC, 0644, "writing"));
  auto write_all = [&](const void* buf, size_t n, uint64_t offset) {
    return fileio::pwrite_all(fd.get(), path, buf, n, offset);
  };
  ZINF_RETURN_IF_ERROR(write_all(header, sizeof(header), 0));
  return write_all(tokens.data(), tokens.size_bytes(), sizeof(header));
}

}  // namespace zinf::model
