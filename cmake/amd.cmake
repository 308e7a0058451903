# amd.cmake - the amd backend: CMake's HIP language on a ROCm install (/opt/rocm) or on Debian's packaged ROCm 5.2.
set(CMAKE_HIP_ARCHITECTURES ${ATTNFUZZ_AMD_ARCHS})
if(NOT ATTNFUZZ_ROCM_PATH AND EXISTS /opt/rocm)
  set(ATTNFUZZ_ROCM_PATH /opt/rocm)
endif()
if(ATTNFUZZ_ROCM_PATH)
  # A real ROCm install: CMake's HIP support works as documented.
  list(APPEND CMAKE_PREFIX_PATH ${ATTNFUZZ_ROCM_PATH})
  if(NOT CMAKE_HIP_COMPILER AND NOT DEFINED ENV{HIPCXX})
    set(CMAKE_HIP_COMPILER ${ATTNFUZZ_ROCM_PATH}/llvm/bin/clang++)
  endif()
else()
  # Debian 12's ROCm 5.2 packages need four workarounds with CMake 3.25 (verified on Debian 12):
  # (0) the default clang++ (14) cannot read ROCm 5.2's LLVM-15 bitcode;
  if(NOT CMAKE_HIP_COMPILER AND NOT DEFINED ENV{HIPCXX})
    set(CMAKE_HIP_COMPILER /usr/bin/clang++-15)
  endif()
  # (1) hip-lang's CMake config lives under lib/x86_64-linux-gnu, where CMake does not look;
  file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/rocm-root/lib/cmake)
  if(NOT EXISTS ${CMAKE_BINARY_DIR}/rocm-root/lib/cmake/hip-lang)
    file(CREATE_LINK /usr/lib/x86_64-linux-gnu/cmake/hip-lang ${CMAKE_BINARY_DIR}/rocm-root/lib/cmake/hip-lang SYMBOLIC)
  endif()
  set(CMAKE_HIP_COMPILER_ROCM_ROOT ${CMAKE_BINARY_DIR}/rocm-root)
  # (2) clang does not find Debian's HIP headers and device bitcode by itself;
  set(CMAKE_HIP_FLAGS "--rocm-path=/usr --rocm-device-lib-path=/usr/lib/x86_64-linux-gnu/amdgcn/bitcode ${CMAKE_HIP_FLAGS}")
  # (3) hip-lang-config's find_dependency(amd_comgr) inside try_compile.
  set(amd_comgr_DIR /usr/lib/x86_64-linux-gnu/cmake/amd_comgr)
  list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES amd_comgr_DIR)
endif()
enable_language(HIP)
set(CMAKE_HIP_STANDARD 20)
find_package(hip CONFIG QUIET)
if(TARGET hip::host)
  set(ATTNFUZZ_amd_RUNTIME hip::host)
else()
  find_library(AMDHIP64 amdhip64 REQUIRED)
  set(ATTNFUZZ_amd_RUNTIME ${AMDHIP64})
endif()
