/* Open MPI peer for comm_bench (compiled at bench time with mpicc; run with mpirun).
 *   mpi_peer MAX_BYTES MIN_BYTES [LOOP_SECONDS]
 * Prints lines "mpi <op> <nranks> <bytes> <time_us>" (median of 3 timed loops, max over ranks).
 * Loop lengths as comm_bench's own ranks and gloo_peer.py: 2 warm-up calls, one probe call after a
 * barrier, iterations = clamp(LOOP_SECONDS (default 0.15) / probe, 3, 5000), the MAX over ranks. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const char* ops[] = {"all_reduce", "all_gather", "reduce_scatter"};
  long max = atol(argv[1]);
  const double loop_seconds = argc > 3 ? atof(argv[3]) : 0.15;
  float* a = malloc(max);
  float* b = malloc(max);
  for (long i = 0; i < max / 4; ++i) a[i] = 1.0f;
  for (int o = 0; o < 3; ++o) {
    for (long size = atol(argv[2]); size <= max; size *= 4) {
      int count = (int)(size / 4);
      double reps[3];
      int iters = 3;
      /* k = -2: 2 warm-up calls; k = -1: the probe (1 call); k = 0..2: the timed loops. */
      for (int k = -2; k < 3; ++k) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t = MPI_Wtime();
        int it = k == -2 ? 2 : k == -1 ? 1 : iters;
        for (int i = 0; i < it; ++i) {
          if (o == 0) MPI_Allreduce(a, b, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
          else if (o == 1) MPI_Allgather(a, count / n, MPI_FLOAT, b, count / n, MPI_FLOAT, MPI_COMM_WORLD);
          else MPI_Reduce_scatter_block(a, b, count / n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }
        double dt = (MPI_Wtime() - t) / it;
        if (k == -1) {
          int mine = (int)(loop_seconds / (dt > 1e-7 ? dt : 1e-7));
          if (mine < 3) mine = 3;
          if (mine > 5000) mine = 5000;
          MPI_Allreduce(&mine, &iters, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        } else if (k >= 0) {
          reps[k] = dt;
        }
      }
      qsort(reps, 3, sizeof(double), cmp);
      double med = reps[1], mx;
      MPI_Reduce(&med, &mx, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      if (rank == 0) printf("mpi %s %d %ld %.3f\n", ops[o], n, size, mx * 1e6);
    }
  }
  fflush(stdout);
  MPI_Finalize();
  return 0;
}
