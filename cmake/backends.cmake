# backends.cmake - compiles the same .hip sources once per backend through generated wrapper files.

# af_backend_sources(<backend> <hip files...> OUT <var>): for each .hip file, a wrapper in the build
# tree that #includes it, with the extension and language the backend's compiler needs.
function(af_backend_sources backend)
  cmake_parse_arguments(A "" "OUT" "" ${ARGN})
  set(ext_cpu cpp)
  set(ext_nvidia cu)
  set(ext_amd hip)
  set(lang_cpu CXX)
  set(lang_nvidia CUDA)
  set(lang_amd HIP)
  set(out)
  foreach(src ${A_UNPARSED_ARGUMENTS})
    get_filename_component(abs ${src} ABSOLUTE)
    file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${abs})
    string(REPLACE "/" "_" flat ${rel})
    set(wrapper ${CMAKE_BINARY_DIR}/backend-${backend}/${flat}.${ext_${backend}})
    file(GENERATE OUTPUT ${wrapper} CONTENT "// generated: ${rel} for the ${backend} backend\n#include \"${abs}\"\n")
    set_source_files_properties(${wrapper} PROPERTIES LANGUAGE ${lang_${backend}} GENERATED TRUE
                                OBJECT_DEPENDS ${abs})
    list(APPEND out ${wrapper})
  endforeach()
  set(${A_OUT} ${out} PARENT_SCOPE)
endfunction()

# af_backend_target(<target> <backend>): compile definitions and include paths for a backend's code.
function(af_backend_target target backend)
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR})
  if(backend STREQUAL "cpu")
    target_compile_definitions(${target} PRIVATE ATTNFUZZ_BACKEND_CPU=1)
  elseif(backend STREQUAL "nvidia")
    target_compile_definitions(${target} PRIVATE ATTNFUZZ_BACKEND_NVIDIA=1)
    set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES "${ATTNFUZZ_CUDA_ARCHS}")
  else()
    target_compile_definitions(${target} PRIVATE ATTNFUZZ_BACKEND_AMD=1)
    set_target_properties(${target} PROPERTIES HIP_ARCHITECTURES "${ATTNFUZZ_AMD_ARCHS}")
  endif()
endfunction()

# af_plugin(<target> <backend> <hip files...>): a kernel plug-in (MODULE library exporting
# attnfuzz_plugin()) built from .hip sources for one backend. A cpu plug-in leaves the emulator's
# symbols undefined: they resolve against the tool that loads it (tools are built with ENABLE_EXPORTS).
function(af_plugin target backend)
  af_backend_sources(${backend} ${ARGN} OUT wrapped)
  add_library(${target} MODULE ${wrapped})
  af_backend_target(${target} ${backend})
  set_target_properties(${target} PROPERTIES PREFIX "lib" LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lib)
  if(backend STREQUAL "cpu")
    af_use_pch(${target})  # precompiled standard headers (CMakeLists.txt); C++ only, so not the GPU backends
  elseif(backend STREQUAL "nvidia")
    target_link_libraries(${target} PRIVATE CUDA::cudart_static)
  elseif(backend STREQUAL "amd")
    target_link_libraries(${target} PRIVATE ${ATTNFUZZ_amd_RUNTIME})
  endif()
endfunction()
