#include <gtest/gtest.h>

#include "tests/dist/dist_util.h"

namespace moelab::disttest {
namespace {

class CommTest : public ::testing::TestWithParam<int> {};

TEST_P(CommTest, EveryCollectiveUnderMpirun) {
  const int np = GetParam();
#ifndef MOELAB_HAVE_MPI
  if (np > 0) GTEST_SKIP() << "built without MPI";
#endif
  if (np > 0 && !HaveMpirun()) GTEST_SKIP() << "mpirun not found";
  EXPECT_EQ(Shell(Mpirun(np) + BinDir() + "/dist_comm_worker"), 0) << "np=" << np;
}

// np = 0: the worker alone, no launcher: a single-process communicator, no MPI initialised.
INSTANTIATE_TEST_SUITE_P(Ranks, CommTest, ::testing::Values(0, 1, 2, 3, 4));

}  // namespace
}  // namespace moelab::disttest
