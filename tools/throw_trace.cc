// Prints the type and a backtrace of every C++ exception a process throws, caught or not, to stderr, then throws it
// as usual. For hunting a rare failure whose message alone does not say where it came from (the tenth session found
// the tuner's "could not create a memory object" this way, docs/performance.md). Build and use:
//   g++ -O1 -shared -fPIC -o /tmp/throw_trace.so tools/throw_trace.cc -ldl
//   LD_PRELOAD=/tmp/throw_trace.so build/bin/osprey bench MODEL.onnx 2> trace.txt
//   addr2line -f -C -e build/bin/osprey 0xOFFSET ...       # the "binary+0xOFFSET" lines, for names of static code
#include <dlfcn.h>
#include <execinfo.h>

#include <cstdio>
#include <typeinfo>

extern "C" [[noreturn]] void __cxa_throw(void* object, std::type_info* type, void (*destroy)(void*)) {
  using Throw = void (*)(void*, std::type_info*, void (*)(void*));
  static const Throw real = reinterpret_cast<Throw>(dlsym(RTLD_NEXT, "__cxa_throw"));
  std::fprintf(stderr, "throw %s\n", type->name());
  void* frames[64];
  const int n = backtrace(frames, 64);
  for (int i = 0; i < n; ++i) {
    Dl_info info;
    if (dladdr(frames[i], &info) != 0 && info.dli_fname != nullptr)
      std::fprintf(stderr, "  %s+0x%lx %s\n", info.dli_fname,
                   static_cast<unsigned long>(static_cast<char*>(frames[i]) - static_cast<char*>(info.dli_fbase)),
                   info.dli_sname != nullptr ? info.dli_sname : "");
  }
  real(object, type, destroy);
  __builtin_unreachable();
}
