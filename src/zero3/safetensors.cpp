// safetensors writer (streamed, atomic) and reader (validated header, fp32/fp16/bf16 tensors).
#include "zinf/zero3/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/json_check.h"
#include "zinf/optim/half.h"
#include "zero3/file_util.h"

namespace zinf::zero3 {
namespace {

std::uint64_t numel_of(const std::vector<std::int64_t>& shape) {
  std::uint64_t n = 1;
  for (std::int64_t d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

std::size_t dtype_bytes(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  return 0;
}

}  // namespace

Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    for (std::int64_t d : t.shape) {
      if (d < 0) return Status::invalid_argument(fmt::format("{}: tensor {} has a negative dimension", path, t.name));
    }
    if (t.dtype != "F32" && t.dtype != "BF16" && t.dtype != "F16") {
      return Status::invalid_argument(
          fmt::format("{}: tensor {} has dtype \"{}\"; zinf writes F32, BF16 or F16", path, t.name, t.dtype));
    }
    const std::uint64_t bytes = numel_of(t.shape) * dtype_bytes(t.dtype);
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  // An exported model for other tools to read: the usual 0644 (less the umask), not 0600.
  ZINF_ASSIGN_OR_RETURN(AtomicFile file, AtomicFile::create(path, 0644));
  const std::uint64_t len = text.size();
  unsigned char len_le[8];
  for (int i = 0; i < 8; ++i) len_le[i] = static_cast<unsigned char>(len >> (8 * i));
  ZINF_RETURN_IF_ERROR(file.append(len_le, 8));
  ZINF_RETURN_IF_ERROR(file.append(text.data(), text.size()));
  std::vector<float> values;
  std::vector<std::uint16_t> half;
  for (const TensorToWrite& t : tensors) {
    values.assign(numel_of(t.shape), 0.0f);
    ZINF_RETURN_IF_ERROR(t.fill(values).with_context(fmt::format("{}: tensor {}", path, t.name)));
    if (t.dtype == "F32") {
      ZINF_RETURN_IF_ERROR(file.append(values.data(), values.size() * sizeof(float)));
      continue;
    }
    // Round to nearest even, as torch's .to(bfloat16 / float16) does.
    half.resize(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      half[i] = t.dtype == "BF16" ? optim::f32_to_bf16_bits(values[i]) : optim::f32_to_f16_bits(values[i]);
    }
    ZINF_RETURN_IF_ERROR(file.append(half.data(), half.size() * sizeof(std::uint16_t)));
  }
  return file.commit();
}

Result<SafetensorsReader> SafetensorsReader::open(const std::string& path) {
  ZINF_ASSIGN_OR_RETURN(std::uint64_t file_size, file_size_of(path));
  unsigned char len_le[8];
  if (file_size < 8) return Status::corruption(fmt::format("{}: {} bytes is too short for a safetensors file", path, file_size));
  ZINF_RETURN_IF_ERROR(read_exact(path, 0, len_le, 8));
  std::uint64_t len = 0;
  for (int i = 0; i < 8; ++i) len |= static_cast<std::uint64_t>(len_le[i]) << (8 * i);
  if (len > file_size - 8 || len > (100u << 20)) {
    return Status::corruption(fmt::format("{}: header length {} does not fit in a {}-byte file", path, len, file_size));
  }
  std::string text(len, '\0');
  ZINF_RETURN_IF_ERROR(read_exact(path, 8, text.data(), len));
  auto parsed = jsonck::parse<nlohmann::json>(text, path + " (safetensors header)");
  if (!parsed.is_ok() || !parsed.value().is_object()) {
    return Status::corruption(fmt::format("{}: the safetensors header is not a JSON object{}", path,
                                          parsed.is_ok() ? "" : " (" + parsed.status().message() + ")"));
  }
  const nlohmann::json& header = parsed.value();
  SafetensorsReader reader;
  reader.path_ = path;
  reader.data_start_ = 8 + len;
  const std::uint64_t data_size = file_size - reader.data_start_;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) return Status::corruption(fmt::format("{}: __metadata__ is not an object", path));
      for (const auto& [k, v] : value.items()) {
        if (v.is_string()) reader.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    SafetensorsEntry e;
    e.name = name;
    const nlohmann::json* dtype = jsonck::member(value, "dtype");
    const nlohmann::json* shape = jsonck::member(value, "shape");
    const nlohmann::json* offsets = jsonck::member(value, "data_offsets");
    const bool well_formed = dtype != nullptr && dtype->is_string() && shape != nullptr && shape->is_array() &&
                             offsets != nullptr && offsets->is_array() && offsets->size() == 2 &&
                             (*offsets)[0].is_number_unsigned() && (*offsets)[1].is_number_unsigned();
    if (!well_formed) return Status::corruption(fmt::format("{}: tensor {}: malformed header entry", path, name));
    e.dtype = dtype->get<std::string>();
    // Element counts are checked for overflow: a wrapped product could match any offsets.
    std::uint64_t numel = 1;
    for (const auto& d : *shape) {
      if (!d.is_number_integer() || (!d.is_number_unsigned() && d.get<std::int64_t>() < 0) ||
          d.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
          __builtin_mul_overflow(numel, d.get<std::uint64_t>(), &numel)) {
        return Status::corruption(fmt::format("{}: tensor {}: bad shape {}", path, name, shape->dump()));
      }
      e.shape.push_back(d.get<std::int64_t>());
    }
    e.begin = (*offsets)[0].get<std::uint64_t>();
    e.end = (*offsets)[1].get<std::uint64_t>();
    const std::size_t elem = dtype_bytes(e.dtype);
    if (elem == 0) return Status::unsupported(fmt::format("{}: tensor {}: dtype {} (zinf reads F32, F16, BF16)", path, name, e.dtype));
    std::uint64_t bytes = 0;
    if (e.end < e.begin || e.end > data_size || __builtin_mul_overflow(numel, elem, &bytes) || e.end - e.begin != bytes) {
      return Status::corruption(fmt::format("{}: tensor {}: data_offsets [{}, {}] do not match shape and file size {}",
                                            path, name, e.begin, e.end, data_size));
    }
    reader.entries_.push_back(std::move(e));
  }
  return reader;
}

const SafetensorsEntry* SafetensorsReader::find(const std::string& name) const {
  for (const SafetensorsEntry& e : entries_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

Status SafetensorsReader::read_f32(const std::string& name, std::span<float> out) const {
  const SafetensorsEntry* e = find(name);
  if (e == nullptr) return Status::not_found(fmt::format("{}: no tensor named {}", path_, name));
  const std::uint64_t n = numel_of(e->shape);
  if (n != out.size()) {
    return Status::invalid_argument(
        fmt::format("{}: tensor {} has {} elements, the model expects {}", path_, name, n, out.size()));
  }
  if (e->dtype == "F32") return read_exact(path_, data_start_ + e->begin, out.data(), n * 4);
  std::vector<std::uint16_t> half(n);
  ZINF_RETURN_IF_ERROR(read_exact(path_, data_start_ + e->begin, half.data(), n * 2));
  for (std::uint64_t i = 0; i < n; ++i) {
    out[i] = e->dtype == "BF16" ? optim::bf16_bits_to_f32(half[i]) : optim::f16_bits_to_f32(half[i]);
  }
  return Status::ok();
}

}  // namespace zinf::zero3
