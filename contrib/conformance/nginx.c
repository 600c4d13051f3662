/* A stand-in for the nginx test image: a process named nginx whose command line says
 * "master process", writing /var/run/nginx.pid, serving with busybox httpd on $NGINX_PORT (80). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
static pid_t child;
static void on_term(int sig) { if (child > 0) kill(child, SIGTERM); _exit(0); }
int main(int argc, char **argv) {
  if (argc < 2 || strcmp(argv[1], "--master") != 0) {
    char *args[] = {"nginx: master process nginx -g daemon off;", "--master", NULL};
    execv("/usr/sbin/nginx", args);
    perror("execv");
    return 1;
  }
  const char *port = getenv("NGINX_PORT");
  if (!port) port = "80";
  signal(SIGTERM, on_term);
  signal(SIGINT, on_term);
  child = fork();
  if (child == 0) {
    execl("/bin/httpd", "httpd", "-f", "-p", port, "-h", "/usr/share/nginx/html", NULL);
    _exit(127);
  }
  FILE *f = fopen("/var/run/nginx.pid", "w");
  if (f) { fprintf(f, "%d\n", getpid()); fclose(f); }
  int status;
  while (waitpid(child, &status, 0) < 0) {}
  return 1;
}
