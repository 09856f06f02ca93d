// Debian's civetweb (prometheus-cpp's Exposer serves /metrics with it) asks for 100 KiB thread
// stacks, less than the static TLS of the libraries the flashdraft binaries link (LibTorch,
// OpenBLAS, glog...), so its pthread_create failed with EINVAL. Every stack size asked for in the
// process gets a 1 MiB floor. The definition must be in the executable to take precedence over
// libc's: this file is compiled into each binary that serves /metrics (an object library, never a
// static one, whose member nobody references would be left out).
#include <dlfcn.h>
#include <pthread.h>

#include <cstddef>

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  using Fn = int (*)(pthread_attr_t*, size_t);
  static const Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  constexpr size_t kFloor = size_t{1} << 20;
  return real(attr, size < kFloor ? kFloor : size);
}
