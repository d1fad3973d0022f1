// Run under mpirun by comm_test.cc: exercises every collective of MpiCommunicator and exits
// non-zero (with the reason on stderr) when a result is wrong.
#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

#include "core/comm/communicator.h"

namespace {

int failures = 0;

void Expect(bool ok, const char* what, int rank) {
  if (!ok) {
    std::fprintf(stderr, "rank %d: %s\n", rank, what);
    ++failures;
  }
}

}  // namespace

int main() {
  using namespace moelab;
  std::unique_ptr<Communicator> comm = MakeWorldCommunicator();
  const int r = comm->rank(), w = comm->world_size();
  Expect(w == LauncherWorldSize(), "world size differs from the launcher's", r);
  Expect(w == 1 || comm->kind() == "mpi", "several ranks but not an MPI communicator", r);

  // Sum: 1000 floats (not divisible by 3), values r + i.
  std::vector<float> f(1000);
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(r + i);
  comm->AllReduceSum(f.data(), f.size());
  bool ok = true;
  for (size_t i = 0; i < f.size(); ++i) ok &= f[i] == static_cast<float>(w * (w - 1) / 2 + w * i);
  Expect(ok, "AllReduceSum(float)", r);

  // A sum is bitwise identical on every rank: the max and min over ranks agree.
  std::vector<float> noisy(257);
  for (size_t i = 0; i < noisy.size(); ++i) noisy[i] = std::sin(1.0f + r * 0.37f + i) * 1e-3f;
  comm->AllReduceSum(noisy.data(), noisy.size());
  std::vector<float> hi = noisy, lo = noisy;
  for (float& x : lo) x = -x;
  comm->AllReduceMax(hi.data(), hi.size());
  comm->AllReduceMax(lo.data(), lo.size());
  ok = true;
  for (size_t i = 0; i < noisy.size(); ++i) ok &= hi[i] == noisy[i] && -lo[i] == noisy[i];
  Expect(ok, "AllReduceSum(float) not identical on every rank", r);

  // Overlap (issue 23): sums started together and completed by WaitAll have the bits of
  // AllReduceSum, in any number of pieces of any sizes.
  std::vector<float> started(1001);
  for (size_t i = 0; i < started.size(); ++i) started[i] = std::sin(2.0f + r * 0.71f + i) * 1e-2f;
  std::vector<float> blocking = started;
  comm->AllReduceSum(blocking.data(), blocking.size());
  comm->StartAllReduceSum(started.data() + 600, 401);
  comm->StartAllReduceSum(started.data() + 3, 597);
  comm->Progress();
  comm->StartAllReduceSum(started.data(), 3);
  comm->WaitAll();
  Expect(started == blocking, "StartAllReduceSum + WaitAll differs from AllReduceSum", r);

  std::vector<double> d = {0.5 * r, 1.0};
  comm->AllReduceSum(d.data(), d.size());
  Expect(d[0] == 0.25 * w * (w - 1) && d[1] == w, "AllReduceSum(double)", r);

  std::vector<int64_t> c = {r, int64_t{1} << 40};
  comm->AllReduceSum(c.data(), c.size());
  Expect(c[0] == w * (w - 1) / 2 && c[1] == (int64_t{1} << 40) * w, "AllReduceSum(int64)", r);

  std::vector<float> m = {static_cast<float>(r), -static_cast<float>(r)};
  comm->AllReduceMax(m.data(), m.size());
  Expect(m[0] == w - 1 && m[1] == 0, "AllReduceMax", r);

  // Reduce-scatter and all-gather with uneven chunks: chunk q has q + 1 elements.
  std::vector<size_t> counts(w);
  for (int q = 0; q < w; ++q) counts[q] = q + 1;
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  std::vector<float> rs(total, 1.0f);
  comm->ReduceScatterSum(rs.data(), counts.data());
  const size_t mine = std::accumulate(counts.begin(), counts.begin() + r, size_t{0});
  ok = true;
  for (size_t i = 0; i < counts[r]; ++i) ok &= rs[mine + i] == static_cast<float>(w);
  Expect(ok, "ReduceScatterSum", r);
  std::vector<float> ag(total, -1.0f);
  for (size_t i = 0; i < counts[r]; ++i) ag[mine + i] = static_cast<float>(100 * r + i);
  comm->AllGatherV(ag.data(), counts.data());
  ok = true;
  for (int q = 0, off = 0; q < w; off += counts[q], ++q) {
    for (size_t i = 0; i < counts[q]; ++i) ok &= ag[off + i] == static_cast<float>(100 * q + i);
  }
  Expect(ok, "AllGatherV", r);

  // Broadcast from the last rank.
  std::vector<float> b(3, static_cast<float>(r));
  comm->Broadcast(b.data(), b.size(), w - 1);
  Expect(b[0] == w - 1 && b[2] == w - 1, "Broadcast", r);

  // All-to-all: rank r sends q + 1 values (r * 10 + q) to rank q.
  std::vector<size_t> sc(w), rc(w);
  std::vector<float> send;
  for (int q = 0; q < w; ++q) {
    sc[q] = q + 1;
    rc[q] = r + 1;
    for (int i = 0; i <= q; ++i) send.push_back(static_cast<float>(r * 10 + q));
  }
  std::vector<float> recv(w * (r + 1), -1.0f);
  comm->AllToAllV(send.data(), sc.data(), recv.data(), rc.data());
  ok = true;
  for (int q = 0; q < w; ++q) {
    for (int i = 0; i <= r; ++i) ok &= recv[q * (r + 1) + i] == static_cast<float>(q * 10 + r);
  }
  Expect(ok, "AllToAllV", r);

  // Sub-communicators: even and odd ranks.
  std::unique_ptr<Communicator> sub = comm->Split(r % 2, r);
  Expect(sub->world_size() == (w + 1 - r % 2) / 2 && sub->rank() == r / 2, "Split layout", r);
  std::vector<int64_t> one = {1, r};
  sub->AllReduceSum(one.data(), one.size());
  int64_t expect = 0;
  for (int q = r % 2; q < w; q += 2) expect += q;
  Expect(one[0] == sub->world_size() && one[1] == expect, "Split AllReduceSum", r);

  comm->Barrier();
  Expect(w == 1 || (comm->stats().calls > 0 && comm->stats().bytes > 0), "stats not counted", r);
  if (failures == 0 && r == 0) std::printf("comm_worker: %d ranks ok\n", w);
  return failures == 0 ? 0 : 1;
}
