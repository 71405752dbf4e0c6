// x86-64 builds target the baseline ISA (SSE2); hot loops marked TALK_HF_VECTOR_CLONES also get an AVX2 clone that
// the loader picks when the CPU has it (GCC's target_clones; other compilers build the baseline only).
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TALK_HF_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TALK_HF_VECTOR_CLONES
#endif
