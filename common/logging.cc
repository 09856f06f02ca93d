#include "common/logging.h"

#include <glog/logging.h>

#include <mutex>

namespace flashdraft {

void InitLogging(const char* program, int verbosity) {
  static std::once_flag once;
  std::call_once(once, [&] {
    FLAGS_logtostderr = true;
    FLAGS_colorlogtostderr = false;
    FLAGS_v = verbosity;
    google::InitGoogleLogging(program);
    google::InstallFailureSignalHandler();
  });
}

}  // namespace flashdraft
