/* What one response write costs the kernel: send(2) against sendmsg(2) with a
 * one-piece iovec, the same 133 bytes (cadeloop's plaintext response) on a
 * loopback TCP connection with TCP_NODELAY, a reader thread draining the other
 * end. The figure is the writing thread's CPU time per call
 * (CLOCK_THREAD_CPUTIME_ID), which on loopback includes the receive path the
 * kernel runs for the peer in the sender's context. Blocks of the two calls
 * alternate, so a host that slows down hits both.
 *
 *   cc -O2 -pthread bench/http/send_cost.c -o build/bench-tools/send_cost
 *   taskset -c 0 build/bench-tools/send_cost [ROUNDS] [CALLS_PER_BLOCK]
 */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static int drain_fd = -1;

static void* drain(void* unused) {
  (void)unused;
  static char buf[1 << 16];
  while (read(drain_fd, buf, sizeof buf) > 0) {
  }
  return NULL;
}

static double thread_cpu_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int cmp_double(const void* a, const void* b) {
  const double x = *(const double*)a;
  const double y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? atoi(argv[1]) : 12;
  const int calls = argc > 2 ? atoi(argv[2]) : 50000;
  if (rounds < 1 || rounds > 1000 || calls < 1) {
    fprintf(stderr, "usage: send_cost [ROUNDS 1..1000] [CALLS_PER_BLOCK]\n");
    return 2;
  }
  struct sockaddr_in addr;
  memset(&addr, 0, sizeof addr);
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  const int lsock = socket(AF_INET, SOCK_STREAM, 0);
  const int out = socket(AF_INET, SOCK_STREAM, 0);
  if (lsock < 0 || out < 0 || bind(lsock, (struct sockaddr*)&addr, sizeof addr) != 0 ||
      listen(lsock, 1) != 0 || getsockname(lsock, (struct sockaddr*)&addr, &len) != 0 ||
      connect(out, (struct sockaddr*)&addr, sizeof addr) != 0 ||
      (drain_fd = accept(lsock, NULL, NULL)) < 0) {
    perror("loopback connection");
    return 1;
  }
  const int one = 1;
  setsockopt(out, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  pthread_t reader;
  if (pthread_create(&reader, NULL, drain, NULL) != 0) {
    perror("pthread_create");
    return 1;
  }
  char msg[133];
  memset(msg, 'x', sizeof msg);
  struct iovec iov = {msg, sizeof msg};
  struct msghdr mh;
  memset(&mh, 0, sizeof mh);
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  double* per_call[2] = {calloc((size_t)rounds, sizeof(double)),
                         calloc((size_t)rounds, sizeof(double))};
  if (per_call[0] == NULL || per_call[1] == NULL) {
    return 1;
  }
  int later = 0;  // how many rounds sendmsg cost more than send
  for (int r = 0; r < rounds; ++r) {
    for (int m = 0; m < 2; ++m) {
      const double t0 = thread_cpu_ns();
      for (int i = 0; i < calls; ++i) {
        const ssize_t n =
            m == 0 ? send(out, msg, sizeof msg, MSG_NOSIGNAL) : sendmsg(out, &mh, MSG_NOSIGNAL);
        if (n != (ssize_t)sizeof msg) {
          perror("send");
          return 1;
        }
      }
      per_call[m][r] = (thread_cpu_ns() - t0) / calls;
    }
    later += per_call[1][r] > per_call[0][r];
  }
  for (int m = 0; m < 2; ++m) {
    printf("%-8s ns/call:", m == 0 ? "send" : "sendmsg");
    for (int r = 0; r < rounds; ++r) {
      printf(" %.0f", per_call[m][r]);
    }
    printf("\n");
    qsort(per_call[m], (size_t)rounds, sizeof(double), cmp_double);
  }
  const double med_send = per_call[0][rounds / 2];
  const double med_msg = per_call[1][rounds / 2];
  printf("median: send %.0f ns, sendmsg %.0f ns (%.2fx); sendmsg dearer in %d of %d rounds\n",
         med_send, med_msg, med_msg / med_send, later, rounds);
  return 0;
}
