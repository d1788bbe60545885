/*
 * pause: the infra process of a Deckhand pod sandbox.
 *
 * It keeps the pod's namespaces alive and does nothing else:
 *   - SIGTERM / SIGINT: exit 0 (a clean StopPodSandbox);
 *   - SIGCHLD: reap every exited child (as PID 1 of a shared PID namespace
 *     it inherits orphans, which must not pile up as zombies);
 *   - everything else keeps its default disposition.
 *
 * Built statically (gcc -static -Os) so the image needs no libc.
 * Signals are blocked outside sigsuspend(), so none can slip in between the
 * "should I stop?" check and going back to sleep.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAUSE_VERSION "deckhand-pause 3.10"

static volatile sig_atomic_t stop_requested;

static void on_stop(int signo)
{
    (void)signo;
    stop_requested = 1;
}

static void on_child(int signo)
{
    /* Only wakes sigsuspend(); the reaping happens in main's loop. */
    (void)signo;
}

static int install(int signo, void (*handler)(int), int flags)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = handler;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    if (sigaction(signo, &sa, NULL) != 0) {
        fprintf(stderr, "pause: sigaction(%d): %s\n", signo, strerror(errno));
        return -1;
    }
    return 0;
}

static void reap_children(void)
{
    /* WNOHANG: collect everything that has exited so far, never block. */
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(int argc, char **argv)
{
    sigset_t watched, sleeping;

    if (argc > 1 && (strcmp(argv[1], "-v") == 0 || strcmp(argv[1], "--version") == 0)) {
        puts(PAUSE_VERSION);
        return 0;
    }
    if (getpid() != 1)
        fprintf(stderr, "pause: warning: not running as PID 1\n");

    sigemptyset(&watched);
    sigaddset(&watched, SIGTERM);
    sigaddset(&watched, SIGINT);
    sigaddset(&watched, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &watched, &sleeping) != 0) {
        fprintf(stderr, "pause: sigprocmask: %s\n", strerror(errno));
        return 1;
    }
    /* While asleep, the watched signals must get through even if the
     * runtime handed us a mask that blocks them. */
    sigdelset(&sleeping, SIGTERM);
    sigdelset(&sleeping, SIGINT);
    sigdelset(&sleeping, SIGCHLD);

    if (install(SIGTERM, on_stop, 0) != 0 || install(SIGINT, on_stop, 0) != 0 ||
        install(SIGCHLD, on_child, SA_NOCLDSTOP) != 0)
        return 1;

    /* Children may have been inherited before the handler existed. */
    reap_children();
    for (;;) {
        sigsuspend(&sleeping); /* always returns -1/EINTR after a handler ran */
        reap_children();
        if (stop_requested)
            return 0;
    }
}
