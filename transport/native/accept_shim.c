/* Loaded into the daemon with LD_PRELOAD (transport/accept_shim.py): accept() and accept4()
 * report a full descriptor table (EMFILE) as ENFILE, and say what the descriptor was when
 * they fail with EINVAL.
 *
 * libzmq 4.3.5 aborts the process when accept() on an ipc listener fails with EMFILE
 * (ipc_listener.cpp: errno_assert whose tolerated list has ENFILE but not EMFILE), while its
 * tcp listener tolerates both. With this, an ipc accept at the limit is tolerated like a tcp
 * one: the connection stays in the kernel's backlog until a descriptor frees.
 *
 * The descriptor reserve (agenthost_accept_reserve, set by the daemon through ctypes): a
 * connection accepted as a descriptor numbered at or above `soft limit - reserve` is closed at
 * once and the accept reports ECONNABORTED (tolerated by both libzmq listeners: the monitor's
 * `accept failed`). The kernel hands out the lowest free number, so such a number means every
 * number below it was in use: accepted connections never hold a number in the top `reserve`,
 * and the process's descriptors stay below its limit by what its own use (store, workers,
 * logs) takes there — without waiting on the connection guard, which counts after the fact
 * on a thread of its own. Connections accepted on an ipc path that starts with
 * agenthost_accept_keep (the worker links) are kept: the reserve is theirs. 0: no reserve.
 *
 * EINVAL means the descriptor is no listening socket (or a listener shut down). libzmq aborts
 * on it too, and the shim passes it on unchanged: a listener that is gone cannot be retried.
 * Before that abort, one line on stderr names the descriptor, whether it listens
 * (SO_ACCEPTCONN), its file type and its /proc/self/fd link: what the abort message alone does
 * not say (docs/design/connections.md). Every other errno and every success pass through. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int (*accept4_fn)(int, struct sockaddr *, socklen_t *, int);
typedef int (*accept_fn)(int, struct sockaddr *, socklen_t *);

int agenthost_accept_shim_loaded = 1;
int agenthost_accept_reserve;
char agenthost_accept_keep[512];
unsigned long agenthost_accept_refused;

/* Whether `fd`, accepted on a Unix socket, has a local path under agenthost_accept_keep. */
static int kept(int fd)
{
    if (!agenthost_accept_keep[0])
        return 0;
    struct sockaddr_un un;
    socklen_t len = sizeof un;
    if (getsockname(fd, (struct sockaddr *)&un, &len) != 0 || un.sun_family != AF_UNIX)
        return 0;
    size_t n = strnlen(agenthost_accept_keep, sizeof agenthost_accept_keep);
    return len > offsetof(struct sockaddr_un, sun_path) + n
        && strncmp(un.sun_path, agenthost_accept_keep, n) == 0;
}

/* A connection accepted into the reserve: closed at once, the accept reported aborted. */
static int into_reserve(int r)
{
    int reserve = __atomic_load_n(&agenthost_accept_reserve, __ATOMIC_RELAXED);
    if (reserve <= 0)
        return 0;
    struct rlimit lim;
    if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY
        || (rlim_t)r + (rlim_t)reserve < lim.rlim_cur || kept(r))
        return 0;
    close(r);
    __atomic_add_fetch(&agenthost_accept_refused, 1, __ATOMIC_RELAXED);
    return 1;
}

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
    if (r >= 0 && into_reserve(r)) {
        errno = ECONNABORTED;
        return -1;
    }
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
