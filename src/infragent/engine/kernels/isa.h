// The instruction set the quantized-weight products run, shared by every file of that library: the widest this
// CPU has unless $INFRAGENT_ISA (read at first use) or qgemm_set_isa names a narrower one, so a test can run
// the AVX2 path on an AVX-512 machine.
#pragma once

#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>
#include <string>

namespace infragent_isa {

enum class Isa : int { Unset = -1, Generic = 0, Avx2 = 1, Avx512 = 2 };
inline const char* kIsaNames[] = {"generic", "avx2", "avx512"};
inline std::atomic<int> chosen{static_cast<int>(Isa::Unset)};

inline Isa widest() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    return Isa::Avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::Avx2;
  return Isa::Generic;
}

// Whether the CPU has AVX-512 VNNI (vpdpbusd: four u8 x s8 products summed into each int32 lane).
inline bool has_vnni() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni");
}

inline Isa parse(const std::string& name) {
  const Isa best = widest();
  if (name.empty() || name == "auto") return best;
  for (int i = 0; i < 3; ++i)
    if (name == kIsaNames[i]) {
      TORCH_CHECK(i <= static_cast<int>(best), "INFRAGENT_ISA=", name, ": this CPU's widest is ",
                  kIsaNames[static_cast<int>(best)], "; use auto or a narrower one");
      return static_cast<Isa>(i);
    }
  TORCH_CHECK(false, "INFRAGENT_ISA=", name, ": choose auto, avx512, avx2 or generic");
}

inline Isa isa() {
  int now = chosen.load();
  if (now == static_cast<int>(Isa::Unset)) {
    const char* env = std::getenv("INFRAGENT_ISA");
    now = static_cast<int>(parse(env != nullptr ? env : ""));
    chosen.store(now);
  }
  return static_cast<Isa>(now);
}

inline void choose(const std::string& name) { chosen.store(static_cast<int>(parse(name))); }

}  // namespace infragent_isa
