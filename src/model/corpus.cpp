// The generated fallback corpus: deterministic English-like sentences from a small grammar.
#include <array>
#include <cctype>
#include <string>
#include <string_view>

#include "model/rng.h"
#include "zinf/model/data.h"

namespace zinf::model {

namespace {

constexpr std::array<std::string_view, 16> kSubjects = {
    "the engineer",  "a small model", "the old library",   "every student",
    "the river",     "our team",      "the quiet machine", "a careful reader",
    "the city",      "the gardener",  "a tired traveller", "the young teacher",
    "the committee", "my neighbour",  "the storm",         "a patient builder"};
constexpr std::array<std::string_view, 16> kVerbs = {
    "writes",  "reads",   "builds",  "remembers", "carries",   "finds", "measures", "explains",
    "watches", "follows", "repairs", "shares",    "describes", "opens", "counts",   "keeps"};
constexpr std::array<std::string_view, 16> kObjects = {
    "a long letter",    "the morning light", "every page of the book", "the answer",
    "a simple rule",    "the old bridge",    "many small stones",      "the last train",
    "a clear signal",   "the warm bread",    "a map of the valley",    "the broken clock",
    "two green apples", "the first chapter", "a quiet song",           "the open window"};
constexpr std::array<std::string_view, 12> kPlaces = {"before dawn",
                                                      "with great care",
                                                      "in the evening",
                                                      "without a word",
                                                      "near the sea",
                                                      "after the storm",
                                                      "every day",
                                                      "for a while",
                                                      "at the edge of the town",
                                                      "in the garden",
                                                      "under the bright stars",
                                                      "on the way home"};
constexpr std::array<std::string_view, 6> kJoins = {"and then", "because", "while",
                                                    "but",      "so",      "although"};

class Words {
 public:
  explicit Words(uint64_t seed) : seed_(seed) {}
  template <size_t N>
  std::string_view pick(const std::array<std::string_view, N>& list) {
    return list[detail::below(detail::hash3(seed_, counter_++, 0x636f7270), N)];
  }
  uint64_t roll(uint64_t n) { return detail::below(detail::hash3(seed_, counter_++, 1), n); }

 private:
  uint64_t seed_;
  uint64_t counter_ = 0;
};

std::string clause(Words& w) {
  std::string c(w.pick(kSubjects));
  c += ' ';
  c += w.pick(kVerbs);
  c += ' ';
  c += w.pick(kObjects);
  return c;
}

std::string sentence(Words& w) {
  std::string s;
  switch (w.roll(4)) {
    case 0:
      s = clause(w) + " " + std::string(w.pick(kPlaces));
      break;
    case 1:
      s = clause(w) + ", " + std::string(w.pick(kJoins)) + " " + clause(w);
      break;
    case 2:
      s = std::string(w.pick(kPlaces)) + ", " + clause(w);
      break;
    default:
      s = clause(w) + " " + std::string(w.pick(kPlaces)) + ", " + std::string(w.pick(kJoins)) +
          " " + clause(w);
      break;
  }
  s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
  return s + ".";
}

}  // namespace

std::string generated_corpus(size_t min_bytes) {
  Words w(0x7a696e66);  // fixed: the fallback corpus is the same everywhere
  std::string text;
  while (text.size() < min_bytes) {
    const uint64_t sentences = 3 + w.roll(4);
    for (uint64_t i = 0; i < sentences; i++) {
      if (i > 0) text += ' ';
      text += sentence(w);
    }
    text += "\n\n";
  }
  return text;
}

}  // namespace zinf::model
