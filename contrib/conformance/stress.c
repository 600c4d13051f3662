/* A stand-in for stress(1) as containerd's integration suite runs it in the resource-consumer
 * image: `stress -m N --vm-bytes SIZE[K|M|G] --vm-hang 0 -t SECONDS` allocates SIZE in each of
 * N workers, touches every page, holds it and exits after SECONDS. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
static long long parse_size(const char *s) {
  char *end;
  long long n = strtoll(s, &end, 10);
  switch (*end) {
    case 'g': case 'G': n *= 1024;  /* fall through */
    case 'm': case 'M': n *= 1024;  /* fall through */
    case 'k': case 'K': n *= 1024;
  }
  return n;
}
int main(int argc, char **argv) {
  int workers = 1, seconds = 0;
  long long bytes = 256LL << 20;
  for (int i = 1; i + 1 < argc; i++) {
    if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--vm")) workers = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--vm-bytes")) bytes = parse_size(argv[++i]);
    else if (!strcmp(argv[i], "-t") || !strcmp(argv[i], "--timeout")) seconds = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--vm-hang")) i++;
  }
  pid_t pids[64];
  if (workers > 64) workers = 64;
  for (int w = 0; w < workers; w++) {
    if ((pids[w] = fork()) == 0) {
      char *p = malloc(bytes);
      if (!p) _exit(1);
      for (long long o = 0; o < bytes; o += 4096) p[o] = 1;
      for (;;) pause();
    }
  }
  if (seconds > 0) {
    sleep(seconds);
    for (int w = 0; w < workers; w++) kill(pids[w], SIGTERM);
  }
  while (wait(NULL) > 0) {}
  return 0;
}
