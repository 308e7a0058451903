# nvidia.cmake - the nvidia backend: nvcc compiles the .hip sources through include/attnfuzz/hip_cuda.h.
if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
set(CMAKE_CUDA_ARCHITECTURES ${ATTNFUZZ_CUDA_ARCHS})
enable_language(CUDA)
set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 knows no CUDA20 flag for nvcc 13
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
find_package(CUDAToolkit REQUIRED)
set(ATTNFUZZ_nvidia_RUNTIME CUDA::cudart_static)
