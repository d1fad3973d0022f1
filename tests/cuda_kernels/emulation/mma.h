// Stands in for CUDA's <mma.h> when kernels are compiled for the CPU emulation: nvcuda::wmma
// comes from cuda_emulation.h, which must be included first.
#pragma once
#ifndef MOELAB_CUDA_EMULATION
#error "tests/cuda_kernels/emulation/mma.h is for the CPU emulation only"
#endif
