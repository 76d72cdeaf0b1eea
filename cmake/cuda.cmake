# CUDA backend (issue 16): osprey_kernels_cuda from src/kernels/cuda (*.cu: device code, nvcc, C++17; *.cc: host code,
# the C++ compiler). Included by CMakeLists.txt before osprey_runtime; sets OSPREY_HAVE_CUDA.
#
# OSPREY_CUDA=AUTO (default): build it when nvcc (and the cuDNN/cuBLAS headers) are found; ON: required; OFF: never.
# The CUDA runtime is linked statically (CUDA::cudart_static: no libcudart.so to ship). cuDNN and cuBLAS are NOT linked:
# src/kernels/cuda/cuda_libs.cc loads them with dlopen at first use, so binaries, the installed package and the Python
# wheel carry no dependency on them; without them the convolution and matrix kernels decline (the CPU runs those steps).
set(OSPREY_CUDA AUTO CACHE STRING "Build the CUDA backend: AUTO (when nvcc is found), ON (required) or OFF")
set_property(CACHE OSPREY_CUDA PROPERTY STRINGS AUTO ON OFF)
set(OSPREY_HAVE_CUDA OFF)
set(OSPREY_PC_CUDA_LIBS "")

function(osprey_cuda_unavailable why)
  if(OSPREY_CUDA STREQUAL "ON")
    message(FATAL_ERROR "osprey: OSPREY_CUDA=ON but ${why}")
  endif()
  message(STATUS "osprey: CUDA backend not built: ${why}")
endfunction()

string(TOUPPER "${OSPREY_CUDA}" _osprey_cuda_mode)
if(_osprey_cuda_mode STREQUAL "OFF")
  message(STATUS "osprey: CUDA backend off (OSPREY_CUDA=OFF)")
elseif(NOT _osprey_cuda_mode STREQUAL "AUTO" AND NOT _osprey_cuda_mode STREQUAL "ON")
  message(FATAL_ERROR "osprey: OSPREY_CUDA must be AUTO, ON or OFF, got '${OSPREY_CUDA}'")
else()
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc CACHE FILEPATH "CUDA compiler")
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    osprey_cuda_unavailable("no nvcc was found (set CMAKE_CUDA_COMPILER or CUDACXX)")
  else()
    # Before enable_language: H200/H100 (sm_90; "90" also embeds compute_90 PTX for newer GPUs). Override with
    # -DCMAKE_CUDA_ARCHITECTURES="80;90".
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
      set(CMAKE_CUDA_ARCHITECTURES 90 CACHE STRING "CUDA architectures to compile for")
    endif()
    if(CCACHE)
      set(CMAKE_CUDA_COMPILER_LAUNCHER ${CCACHE})
    endif()
    set(CMAKE_CUDA_FLAGS_RELEASE "-O2 -DNDEBUG")
    enable_language(CUDA)
    find_package(CUDAToolkit)
    if(NOT CUDAToolkit_FOUND)
      osprey_cuda_unavailable("nvcc was found but not the CUDA toolkit (find_package(CUDAToolkit))")
    else()
      # Headers only: the libraries are loaded at run time.
      find_path(OSPREY_CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES cudnn)
      find_path(OSPREY_CUBLAS_INCLUDE_DIR cublas_v2.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
      if(NOT OSPREY_CUDNN_INCLUDE_DIR OR NOT OSPREY_CUBLAS_INCLUDE_DIR)
        osprey_cuda_unavailable("the cuDNN (cudnn.h) or cuBLAS (cublas_v2.h) headers were not found")
      else()
        set(OSPREY_HAVE_CUDA ON)
      endif()
    endif()
  endif()
endif()

if(OSPREY_HAVE_CUDA)
  message(STATUS "osprey: CUDA backend on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures "
                 "${CMAKE_CUDA_ARCHITECTURES}; cuDNN/cuBLAS loaded at run time)")
  file(GLOB osprey_cuda_srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/kernels/cuda/*.cu
       ${CMAKE_SOURCE_DIR}/src/kernels/cuda/*.cc)
  add_library(osprey_kernels_cuda STATIC ${osprey_cuda_srcs})
  target_include_directories(osprey_kernels_cuda PUBLIC $<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}/include>
                                                        $<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}/src> $<INSTALL_INTERFACE:include>)
  # cuDNN/cuBLAS headers: for the backend's internal headers (tests include them too); not installed.
  target_include_directories(osprey_kernels_cuda PUBLIC $<BUILD_INTERFACE:${OSPREY_CUDNN_INCLUDE_DIR}>
                                                        $<BUILD_INTERFACE:${OSPREY_CUBLAS_INCLUDE_DIR}>)
  set_target_properties(osprey_kernels_cuda PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
                                                       CUDA_RUNTIME_LIBRARY Static)
  target_compile_options(osprey_kernels_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall>)
  # osprey_kernels_reference: the window geometry (MakeWindow) shared with the reference kernels.
  target_link_libraries(osprey_kernels_cuda PUBLIC osprey_ops CUDA::cudart_static
                        PRIVATE osprey_kernels_reference ${CMAKE_DL_LIBS})
  list(APPEND OSPREY_INSTALL_LIBS osprey_kernels_cuda)
  # pkg-config users link the static CUDA runtime themselves (CMake users get it from find_dependency(CUDAToolkit)).
  set(OSPREY_PC_CUDA_LIBS " -L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -ldl -lrt -lpthread")
endif()
