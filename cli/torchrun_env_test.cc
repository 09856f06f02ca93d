// torchrun's environment as run-rank reads it: defaults where torchrun may leave a variable out,
// an error naming the variable and the value otherwise.
#include "cli/torchrun_env.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

namespace flashdraft {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<TorchrunEnv> Read(const std::map<std::string, std::string>& vars) {
  return ReadTorchrunEnv([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

const std::map<std::string, std::string> kStatic = {{"RANK", "4"},
                                                    {"WORLD_SIZE", "6"},
                                                    {"LOCAL_RANK", "1"},
                                                    {"LOCAL_WORLD_SIZE", "3"},
                                                    {"GROUP_RANK", "1"},
                                                    {"MASTER_ADDR", "node-0"},
                                                    {"MASTER_PORT", "29500"},
                                                    {"TORCHELASTIC_RESTART_COUNT", "2"},
                                                    {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                                    {"TORCHELASTIC_RUN_ID", "job-7"}};

TEST(TorchrunEnvTest, ReadsTheContract) {
  auto env = Read(kStatic);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->rank, 4);
  EXPECT_EQ(env->world_size, 6);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->local_world_size, 3);
  EXPECT_EQ(env->group_rank, 1);
  EXPECT_EQ(env->restart_count, 2);
  EXPECT_EQ(env->master_addr, "node-0");
  EXPECT_EQ(env->master_port, 29500);
  EXPECT_TRUE(env->agent_store);
  EXPECT_TRUE(env->MultiNode());
  EXPECT_EQ(CoordinatorKey(*env), "flashdraft/job-7/attempt_2/coordinator");
}

// PyTorchJob and plain scripts set only RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT.
TEST(TorchrunEnvTest, TheMinimalContractDefaultsTheRest) {
  auto env = Read(
      {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "23456"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->local_rank, 0);
  EXPECT_EQ(env->local_world_size, 1);  // one process per pod
  EXPECT_EQ(env->restart_count, 0);
  EXPECT_FALSE(env->agent_store);
  EXPECT_TRUE(env->MultiNode());
  EXPECT_EQ(CoordinatorKey(*env), "flashdraft/none/attempt_0/coordinator");
}

TEST(TorchrunEnvTest, BadValuesAreNamed) {
  struct Case {
    const char* variable;
    const char* value;
    const char* error;
  };
  const Case cases[] = {
      {"RANK", "6", "RANK='6' must be an integer in [0, 5]"},
      {"WORLD_SIZE", "three", "WORLD_SIZE='three' must be an integer"},
      {"LOCAL_RANK", "3", "LOCAL_RANK='3' must be an integer in [0, 2]"},
      {"MASTER_PORT", "70000", "MASTER_PORT='70000' must be an integer in [1, 65535]"},
      {"MASTER_ADDR", "", "MASTER_ADDR is not set"},
      {"TORCHELASTIC_RESTART_COUNT", "-1", "TORCHELASTIC_RESTART_COUNT='-1'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.variable);
    std::map<std::string, std::string> vars = kStatic;
    vars[c.variable] = c.value;
    auto env = Read(vars);
    ASSERT_FALSE(env.ok());
    EXPECT_THAT(env.status().message(), HasSubstr(c.error));
  }
  std::map<std::string, std::string> no_port = kStatic;
  no_port.erase("MASTER_PORT");
  EXPECT_THAT(Read(no_port).status().message(), HasSubstr("MASTER_PORT is not set"));
  EXPECT_THAT(Read({}).status().message(), HasSubstr("RANK is not set: run-rank is started by "
                                                     "torchrun"));
}

}  // namespace
}  // namespace flashdraft
