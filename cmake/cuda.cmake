# CUDA backend (issue 16). Placeholder until src/kernels/cuda lands: CUDA off.
set(OSPREY_HAVE_CUDA OFF)
