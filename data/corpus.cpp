#include "data/corpus.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "base/rng.h"
#include "data/tokenizer.h"

namespace hdp {

namespace {

using sv = std::string_view;

// ------------------------------------------------------------ lengths (integer-only)

// round(65536 * 2^(i/16)), i = 0..16.
constexpr uint64_t kExp2Table[17] = {65536,  68438,  71468,  74632,  77936,  81386,  84990,  88752, 92682,
                                     96785, 101070, 105545, 110218, 115098, 120194, 125515, 131072};

// floor(65536 * log2(x)) for x >= 1 (bit-by-bit squaring, exact integer arithmetic).
int64_t log2_q16(uint64_t x) {
  int n = 63 - std::countl_zero(x);
  uint64_t y = n >= 30 ? (x >> (n - 30)) : (x << (30 - n));  // Q30 in [1, 2)
  int64_t r = static_cast<int64_t>(n) << 16;
  for (int bit = 15; bit >= 0; --bit) {
    y = (y * y) >> 30;
    if (y >= (2ull << 30)) {
      y >>= 1;
      r |= int64_t{1} << bit;
    }
  }
  return r;
}

// floor(2^(v / 65536)), piecewise linear between 16 tabulated points per octave.
uint64_t exp2_q16(int64_t v) {
  if (v < 0) return 0;
  int64_t ip = v >> 16;
  if (ip >= 40) return uint64_t{1} << 40;
  uint64_t frac = static_cast<uint64_t>(v) & 0xFFFF;
  uint64_t idx = frac >> 12, rem = frac & 0xFFF;
  uint64_t m = kExp2Table[idx] + (((kExp2Table[idx + 1] - kExp2Table[idx]) * rem) >> 12);
  return (m << ip) >> 16;
}

int64_t sample_length(Rng& rng, const CorpusOptions& o) {
  const int64_t mu = log2_q16(static_cast<uint64_t>(o.median_length));
  // sigma of log2(length) in Q16; one IEEE division and rounding, identical everywhere.
  const int64_t sigma = std::llround(o.length_sigma / 0.6931471805599453 * 65536.0);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    int64_t s = 0;
    for (int i = 0; i < 12; ++i) s += static_cast<int64_t>(rng.next() >> 48);
    int64_t z = s - 393210;  // ~N(0, 1) in Q16 (Irwin-Hall, 12 terms)
    int64_t l = mu + ((sigma * z) >> 16);
    int64_t len = static_cast<int64_t>(exp2_q16(l));
    if (len >= o.min_length && len <= o.max_length) return len;
  }
  return std::clamp(o.median_length, o.min_length, o.max_length);
}

// ------------------------------------------------------------ the language

constexpr sv kNames[] = {"Alice", "Bruno", "Clara", "Dmitri", "Elena", "Farid",
                         "Greta", "Hiro",  "Ines",  "Jonas",  "Kira",  "Luca"};
constexpr sv kCities[] = {"Ashford", "Brightwater", "Coldharbor", "Dunmore", "Eastvale", "Fernwick"};
constexpr sv kJobs[] = {"baker", "sailor", "teacher", "farmer", "doctor", "painter", "miner", "weaver"};
constexpr sv kColors[] = {"red", "blue", "green", "yellow", "white", "black", "orange", "purple"};
constexpr sv kPets[] = {"cat", "dog", "goat", "parrot", "horse", "rabbit"};
constexpr int kNumNames = 12;

// The fixed facts of the cast (identical in every corpus).
struct Person {
  sv name, city, job, color, pet, friend_name;
};
Person person(int i) {
  return {kNames[i], kCities[(i * 5 + 1) % 6], kJobs[(i * 3 + 2) % 8], kColors[(i * 7 + 3) % 8], kPets[(i * 5) % 6],
          kNames[(i + 5) % kNumNames]};
}

struct Topic {
  sv title;
  sv nouns[10];   // plural = noun + "s"
  sv places[4];
};
constexpr Topic kTopics[] = {
    {"the farm",
     {"cow", "barn", "field", "fence", "hen", "goat", "tractor", "wagon", "bucket", "orchard"},
     {"in the barn", "by the fence", "on the hill", "near the orchard"}},
    {"the sea",
     {"boat", "net", "harbor", "wave", "crab", "sail", "rope", "island", "lighthouse", "gull"},
     {"at the harbor", "on the beach", "near the island", "by the lighthouse"}},
    {"the city",
     {"street", "market", "tower", "bridge", "shop", "square", "train", "clock", "lamp", "window"},
     {"in the market", "on the bridge", "near the tower", "at the station"}},
    {"the forest",
     {"tree", "path", "river", "stone", "deer", "owl", "cabin", "fern", "trail", "mushroom"},
     {"in the woods", "by the river", "under the old tree", "near the cabin"}},
    {"the kitchen",
     {"loaf", "soup", "pot", "table", "plate", "oven", "apple", "cup", "spoon", "kettle"},
     {"in the kitchen", "on the table", "by the oven", "near the window"}},
    {"the school",
     {"book", "lesson", "desk", "map", "letter", "pencil", "garden", "bell", "story", "question"},
     {"in the classroom", "in the garden", "at the library", "by the gate"}},
};
constexpr int kNumTopics = 6;

constexpr sv kVerbs[] = {"saw",     "found",  "carried", "painted", "cleaned",  "watched", "moved", "fixed",
                         "opened",  "liked",  "counted", "visited", "followed", "built",   "sold",  "lost"};
constexpr sv kAdjectives[] = {"small", "old",  "bright", "quiet", "heavy", "warm",  "cold",
                              "tall",  "new",  "empty",  "long",  "round", "broken", "clean"};
constexpr sv kTimes[] = {"In the morning", "After lunch", "At night", "Later", "Every day", "On Sunday",
                         "In the evening", "Before dawn"};
constexpr sv kSaid[] = {"said", "asked", "shouted", "whispered"};
constexpr sv kNumberWords[] = {"zero",    "one",     "two",       "three",    "four",    "five",    "six",
                               "seven",   "eight",   "nine",      "ten",      "eleven",  "twelve",  "thirteen",
                               "fourteen", "fifteen", "sixteen",  "seventeen", "eighteen", "nineteen", "twenty"};

// Zipf-like weights: item i of n has weight 2520 / (i + 1).
template <size_t N>
sv pick_zipf(Rng& rng, const sv (&items)[N]) {
  uint64_t total = 0;
  for (size_t i = 0; i < N; ++i) total += 2520 / (i + 1);
  uint64_t r = rng.below(total);
  for (size_t i = 0; i < N; ++i) {
    uint64_t w = 2520 / (i + 1);
    if (r < w) return items[i];
    r -= w;
  }
  return items[N - 1];
}

template <size_t N>
sv pick_uniform(Rng& rng, const sv (&items)[N]) {
  return items[rng.below(N)];
}

bool starts_with_vowel(sv w) { return !w.empty() && sv("aeiouAEIOU").find(w[0]) != sv::npos; }

class DocumentBuilder {
 public:
  DocumentBuilder(Rng& rng, int64_t target) : rng_(rng), target_(target) {
    out_.reserve(static_cast<size_t>(target) + 256);
    topic_ = &kTopics[rng_.below(kNumTopics)];
    main_[0] = static_cast<int>(rng_.below(kNumNames));
    main_[1] = static_cast<int>((main_[0] + 1 + rng_.below(kNumNames - 1)) % kNumNames);
  }

  std::string build() {
    uint64_t kind = rng_.below(20);
    if (kind < 14)
      story();
    else if (kind < 17)
      worksheet();
    else
      inventory();
    out_.resize(static_cast<size_t>(target_));
    return std::move(out_);
  }

 private:
  bool full() const { return static_cast<int64_t>(out_.size()) >= target_; }
  void put(sv s) { out_.append(s); }
  void put_num(int64_t v) { out_.append(std::to_string(v)); }
  void put_a(sv next_word) { put(starts_with_vowel(next_word) ? "an " : "a "); }

  // Mostly the document's two main characters, sometimes anyone.
  int who() { return rng_.chance(4, 5) ? main_[rng_.below(2)] : static_cast<int>(rng_.below(kNumNames)); }
  sv noun() { return pick_zipf(rng_, topic_->nouns); }
  sv adjective() { return pick_zipf(rng_, kAdjectives); }

  void fact(const Person& p) {
    switch (rng_.below(5)) {
      case 0: put(p.name); put(" lives in "); put(p.city); put("."); break;
      case 1: put(p.name); put(" works as "); put_a(p.job); put(p.job); put("."); break;
      case 2: put(p.name); put(" has "); put_a(p.color); put(p.color); put(" "); put(p.pet); put("."); break;
      case 3: put(p.name); put(" is a friend of "); put(p.friend_name); put("."); break;
      default:
        put("Where does "); put(p.name); put(" live? "); put(p.name); put(" lives in "); put(p.city); put(".");
    }
  }

  void arithmetic(bool line) {
    switch (rng_.below(3)) {
      case 0: {
        int64_t a = rng_.range(0, 99), b = rng_.range(0, 99);
        put_num(a); put(" + "); put_num(b); put(" = "); put_num(a + b);
        break;
      }
      case 1: {
        int64_t a = rng_.range(0, 99), b = rng_.range(0, a);
        put_num(a); put(" - "); put_num(b); put(" = "); put_num(a - b);
        break;
      }
      default: {
        int64_t a = rng_.range(2, 12), b = rng_.range(2, 12);
        put_num(a); put(" times "); put_num(b); put(" is "); put_num(a * b);
      }
    }
    put(line ? ".\n" : ".");
  }

  void counting() {
    const Person p = person(who());
    int64_t start = rng_.range(1, 40), n = rng_.range(3, 8);
    put(p.name); put(" counted the "); put(noun()); put("s: ");
    for (int64_t i = 0; i < n; ++i) {
      if (i) put(", ");
      put_num(start + i);
    }
    put(".");
  }

  void sentence() {
    uint64_t t = rng_.below(100);
    const Person p = person(who());
    if (t < 22) {
      put(pick_uniform(rng_, kTimes)); put(", "); put(p.name); put(" "); put(pick_zipf(rng_, kVerbs));
      put(" the "); put(adjective()); put(" "); put(noun()); put(".");
    } else if (t < 34) {
      put("The "); put(noun()); put(" was "); put(adjective()); put(".");
    } else if (t < 50) {
      put(p.name); put(" "); put(pick_zipf(rng_, kVerbs)); put(" ");
      sv n = noun();
      put_a(n); put(n); put(" "); put(pick_uniform(rng_, topic_->places)); put(".");
    } else if (t < 58) {
      const Person q = person(p.name == kNames[main_[0]] ? main_[1] : main_[0]);
      put(p.name); put(" and "); put(q.name); put(" "); put(pick_zipf(rng_, kVerbs)); put(" the "); put(noun());
      put("s.");
    } else if (t < 74) {
      fact(p);
    } else if (t < 82) {
      arithmetic(false);
    } else if (t < 90) {
      counting();
    } else {
      put("\"The "); put(noun()); put(" is "); put(adjective()); put(",\" "); put(pick_uniform(rng_, kSaid));
      put(" "); put(p.name); put(".");
    }
  }

  void story() {
    const Person p = person(main_[0]);
    if (rng_.chance(1, 2)) {
      put(p.name); put(" and "); put(topic_->title);
    } else {
      put("A story about "); put(topic_->title);
    }
    put("\n\n");
    while (!full()) {
      int64_t n = rng_.range(3, 6);
      for (int64_t i = 0; i < n && !full(); ++i) {
        if (i) put(" ");
        sentence();
      }
      put("\n\n");
    }
  }

  void worksheet() {
    put("Exercises for "); put(person(main_[0]).name); put("\n\n");
    while (!full()) arithmetic(true);
  }

  void inventory() {
    while (!full()) {
      put("Inventory of "); put(topic_->title); put("\n\n");
      int64_t items = rng_.range(3, 12);
      for (int64_t i = 1; i <= items && !full(); ++i) {
        int64_t count = rng_.range(1, 20);
        sv n = noun();
        put_num(i); put(". "); put(kNumberWords[count]); put(" "); put(n); put(count == 1 ? "\n" : "s\n");
      }
      put("\n");
      topic_ = &kTopics[rng_.below(kNumTopics)];
    }
  }

  Rng& rng_;
  int64_t target_;
  std::string out_;
  const Topic* topic_;
  int main_[2];
};

}  // namespace

void validate_corpus_options(const CorpusOptions& o) {
  if (o.documents < 1) throw std::invalid_argument("make-corpus: --documents must be >= 1");
  if (o.min_length < 1) throw std::invalid_argument("make-corpus: --min-length must be >= 1");
  if (o.max_length < o.min_length)
    throw std::invalid_argument("make-corpus: --max-length (" + std::to_string(o.max_length) +
                                ") must be >= --min-length (" + std::to_string(o.min_length) + ")");
  if (o.max_length > (int64_t{1} << 30)) throw std::invalid_argument("make-corpus: --max-length must be <= 2^30");
  if (o.median_length < 1 || o.median_length > (int64_t{1} << 30))
    throw std::invalid_argument("make-corpus: --median-length must be in 1..2^30");
  if (!(o.length_sigma >= 0 && o.length_sigma <= 10))
    throw std::invalid_argument("make-corpus: length_sigma must be in [0, 10]");
}

int64_t demo_document_length(const CorpusOptions& options, int64_t index) {
  validate_corpus_options(options);
  Rng rng(options.seed, static_cast<uint64_t>(index));
  return sample_length(rng, options);
}

std::string generate_demo_document(const CorpusOptions& options, int64_t index) {
  validate_corpus_options(options);
  Rng rng(options.seed, static_cast<uint64_t>(index));
  int64_t length = sample_length(rng, options);
  return DocumentBuilder(rng, length).build();
}

DatasetBuildStats make_demo_corpus(const CorpusOptions& options, const std::string& output) {
  validate_corpus_options(options);
  auto start = std::chrono::steady_clock::now();
  DatasetBuildStats stats;
  TokenDatasetWriter writer(output, kByteVocabSize, kByteTokenizerName, kByteBos, kByteEos);
  std::vector<uint32_t> ids;
  for (int64_t i = 0; i < options.documents; ++i) {
    std::string text = generate_demo_document(options, i);
    ids.clear();
    encode_bytes_append(text, ids);
    ids.push_back(kByteEos);
    writer.append(ids);
    stats.documents += 1;
    stats.input_bytes += static_cast<int64_t>(text.size());
    stats.tokens += static_cast<int64_t>(ids.size());
    stats.max_document_tokens = std::max<int64_t>(stats.max_document_tokens, ids.size());
  }
  writer.finish();
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  spdlog::info("make-corpus: wrote {}: {} documents, {} tokens (mean {:.0f}, longest {}), seed {}, {:.2f} s", output,
               stats.documents, stats.tokens, double(stats.tokens) / double(stats.documents),
               stats.max_document_tokens, options.seed, stats.seconds);
  return stats;
}

}  // namespace hdp
