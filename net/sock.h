/*
 * sock.h — plain TCP sockets for net/: "host:port" addresses, a listener,
 * a connection made by a deadline, and blocking I/O with deadlines on
 * nonblocking sockets.
 *
 * Key design choice: one deadline (an absolute time on kv__now_ms()'s
 * scale, UINT64_MAX for none) bounds every wait, so no caller can hang on
 * a peer that stops answering. Every socket is nonblocking and
 * close-on-exec; a wait is a poll() for the rest of the deadline. Users:
 * the transports' listeners and connection set-up (tcp.c, rdma.c), rdma's
 * RPC frames, kvmaster and its clients (master.c), the view queries
 * (members.c), and the exposure check (serve.c). tcp.c's data path keeps
 * its own two-part deadline (idle and total) and its own loops.
 */
#ifndef KV_NET_SOCK_H
#define KV_NET_SOCK_H

#include <stddef.h>
#include <stdint.h>

struct sockaddr_in;
struct iovec;

/* "host:port" -> sockaddr_in (IPv4, numeric or resolvable; "" or "*" for
 * any). KV_EINVAL. */
int kv__net_parse_addr(const char *addr, struct sockaddr_in *out);

/* A listening socket on addr (SO_REUSEADDR, the given backlog) in *fd; the
 * address it bound (e.g. "0.0.0.0:41234": port 0 picks one) in bound when
 * not NULL. Errors name `what` (the config key, "cluster.listen"):
 * KV_ECONFIG when addr is not host:port, KV_ENET when it cannot be bound,
 * or the socket's errno translated. *fd is -1 on failure. */
int kv__sock_listen(const char *what, const char *addr, int backlog, int *fd, char *bound,
                    size_t boundlen, char *err, size_t errlen);

/* accept4() of a waiting peer: nonblocking, close-on-exec, TCP_NODELAY.
 * The descriptor, or -1 with errno set (EAGAIN: none waiting; EMFILE,
 * ENFILE: out of descriptors). */
int kv__sock_accept(int lfd);

/* A connection to sa (TCP_NODELAY) established by deadline, in *fd:
 * KV_ENET (refused, unreachable), KV_ETIMEDOUT, or the socket's errno
 * translated. *fd is -1 on failure. */
int kv__sock_connect(const struct sockaddr_in *sa, uint64_t deadline, int *fd);

/* Blocking I/O with a deadline on a nonblocking socket. kv__sock_wait:
 * KV_OK once fd is ready for ev, KV_ETIMEDOUT, KV_ENET. kv__sock_xfer:
 * moves all of iov[0..cnt) (consuming it) out (wr) or in; KV_OK,
 * KV_ETIMEDOUT, or KV_ENET (error, or the peer closed while reading).
 * kv__sock_xfer1: the same for one buffer. */
int kv__sock_wait(int fd, short ev, uint64_t deadline);
int kv__sock_xfer(int fd, struct iovec *iov, size_t cnt, int wr, uint64_t deadline);
int kv__sock_xfer1(int fd, void *p, size_t len, int wr, uint64_t deadline);

#endif
