// Internal: one entry point per untrusted-file reader, shared by the libFuzzer targets and the
// regression test. Each feeds `data` to the reader and checks what it returns; a crash, an
// escaped exception, a sanitizer report or a failed check (abort) is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace zinf::fuzz {

void config_text(const std::uint8_t* data, std::size_t size);     // parse_ds_config
void engine_json(const std::uint8_t* data, std::size_t size);     // checkpoint engine.json
void latest_tag(const std::uint8_t* data, std::size_t size);      // checkpoint `latest`
void swap_manifest(const std::uint8_t* data, std::size_t size);   // swap store manifest
void safetensors(const std::uint8_t* data, std::size_t size);     // a whole .safetensors file
void token_file(const std::uint8_t* data, std::size_t size);      // a token file, every format
void hf_config(const std::uint8_t* data, std::size_t size);       // HF folder config.json

using Entry = void (*)(const std::uint8_t*, std::size_t);
// The entry point for a target name ("config_text", ...), or nullptr.
Entry entry_for(std::string_view target);

}  // namespace zinf::fuzz
