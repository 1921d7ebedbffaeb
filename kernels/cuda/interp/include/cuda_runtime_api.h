// The CUDA interpreter's stand-in for the toolkit header (kernels/cuda/interp/cuda_interp.h).
#pragma once
#include "kernels/cuda/interp/cuda_interp.h"
