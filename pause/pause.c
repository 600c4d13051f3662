/*
 * crius's pause program: the first process of every pod sandbox. It holds the pod's
 * namespaces, reaps the zombies that end up parented to it, and exits on SIGINT or SIGTERM.
 * Built statically by build.rs so the built-in sandbox image needs nothing else.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int signo)
{
	fprintf(stderr, "pause: stopping on signal %d\n", signo);
	exit(0);
}

static void on_child(int signo)
{
	(void)signo;
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
}

int main(void)
{
	struct sigaction stop;
	struct sigaction child;

	memset(&stop, 0, sizeof(stop));
	stop.sa_handler = on_stop;
	memset(&child, 0, sizeof(child));
	child.sa_handler = on_child;
	child.sa_flags = SA_NOCLDSTOP;

	if (sigaction(SIGINT, &stop, NULL) < 0 || sigaction(SIGTERM, &stop, NULL) < 0 ||
	    sigaction(SIGCHLD, &child, NULL) < 0) {
		perror("pause: sigaction");
		return 1;
	}
	for (;;)
		pause();
}
