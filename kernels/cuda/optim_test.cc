#include "kernels/cuda/gpu_test_util.h"
EMBER_CUDA_SKIP_FILE("optim")
