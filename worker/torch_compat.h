// LibTorch API differences between the versions flashdraft builds against — Debian's 1.13 on the
// CPU machines, the 2.x of CUDA distributions (PyTorch's own LibTorch) on GPU machines — in one
// place. (bf16 uses explicit casts, model/precision.h, not autocast, whose C++ API changed in 2.4.)
#pragma once

#include <torch/version.h>

// c10d::Store::clone(): a copy a second thread may use, pure virtual since 2.8.
#define FLASHDRAFT_STORE_HAS_CLONE \
  (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8))
