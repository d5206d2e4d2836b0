/* The pod sandbox's process, built here (no registry): holds the pod's namespaces, reaps orphans (it is
 * PID 1 of the pod when the pod shares one PID namespace) and exits on SIGINT/SIGTERM, as the upstream
 * pause container does. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { _exit(0); }

static void reap(int sig) {
    while (waitpid(-1, 0, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction on_stop = {.sa_handler = stop}, on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
    sigaction(SIGINT, &on_stop, 0);
    sigaction(SIGTERM, &on_stop, 0);
    sigaction(SIGCHLD, &on_child, 0);
    for (;;) pause();
}
