/* Loaded into the daemon with LD_PRELOAD (transport/accept_shim.py): accept() and accept4()
 * report a full descriptor table (EMFILE) as ENFILE, and say what the descriptor was when
 * they fail with EINVAL.
 *
 * libzmq 4.3.5 aborts the process when accept() on an ipc listener fails with EMFILE
 * (ipc_listener.cpp: errno_assert whose tolerated list has ENFILE but not EMFILE), while its
 * tcp listener tolerates both. With this, an ipc accept at the limit is tolerated like a tcp
 * one: the connection stays in the kernel's backlog until a descriptor frees.
 *
 * EINVAL means the descriptor is no listening socket (or a listener shut down). libzmq aborts
 * on it too, and the shim passes it on unchanged: a listener that is gone cannot be retried.
 * Before that abort, one line on stderr names the descriptor, whether it listens
 * (SO_ACCEPTCONN), its file type and its /proc/self/fd link: what the abort message alone does
 * not say (docs/design/connections.md). Every other errno and every success pass through. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int (*accept4_fn)(int, struct sockaddr *, socklen_t *, int);
typedef int (*accept_fn)(int, struct sockaddr *, socklen_t *);

int agenthost_accept_shim_loaded = 1;

static void describe_einval(int fd)
{
    static int said;
    if (__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        return;
    char path[48], link[256] = "?";
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n >= 0)
        link[n] = 0;
    int listening = -1;
    socklen_t len = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0)
        listening = -1;
    struct stat st;
    const char *type = "closed";
    if (fstat(fd, &st) == 0)
        type = S_ISSOCK(st.st_mode) ? "socket" : S_ISREG(st.st_mode) ? "file"
             : S_ISFIFO(st.st_mode) ? "pipe" : "other";
    fprintf(stderr, "accept shim: accept on descriptor %d failed with EINVAL: %s, %s, "
            "SO_ACCEPTCONN %d\n", fd, link, type, listening);
}

static int after_accept(int r, int fd)
{
    if (r < 0 && errno == EMFILE)
        errno = ENFILE;
    else if (r < 0 && errno == EINVAL) {
        describe_einval(fd);
        errno = EINVAL;
    }
    return r;
}

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
    static accept4_fn real;
    if (!real)
        real = (accept4_fn)dlsym(RTLD_NEXT, "accept4");
    return after_accept(real(fd, addr, len, flags), fd);
}

int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
    static accept_fn real;
    if (!real)
        real = (accept_fn)dlsym(RTLD_NEXT, "accept");
    return after_accept(real(fd, addr, len), fd);
}
