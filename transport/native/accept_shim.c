/* Loaded into the daemon with LD_PRELOAD (transport/accept_shim.py): accept() and accept4()
 * report a full descriptor table (EMFILE) as ENFILE.
 *
 * libzmq 4.3.5 aborts the process when accept() on an ipc listener fails with EMFILE
 * (ipc_listener.cpp: errno_assert whose tolerated list has ENFILE but not EMFILE), while its
 * tcp listener tolerates both. With this, an ipc accept at the limit is tolerated like a tcp
 * one: the connection stays in the kernel's backlog until a descriptor frees. Nothing else
 * changes: every other errno and every success pass through. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sys/socket.h>

typedef int (*accept4_fn)(int, struct sockaddr *, socklen_t *, int);
typedef int (*accept_fn)(int, struct sockaddr *, socklen_t *);

int agenthost_accept_shim_loaded = 1;

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
    static accept4_fn real;
    if (!real)
        real = (accept4_fn)dlsym(RTLD_NEXT, "accept4");
    int r = real(fd, addr, len, flags);
    if (r < 0 && errno == EMFILE)
        errno = ENFILE;
    return r;
}

int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
    static accept_fn real;
    if (!real)
        real = (accept_fn)dlsym(RTLD_NEXT, "accept");
    int r = real(fd, addr, len);
    if (r < 0 && errno == EMFILE)
        errno = ENFILE;
    return r;
}
