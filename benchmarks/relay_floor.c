/* The floor of a relay (a benchmark's yardstick, not product code): the least any process in the path can cost.
 *
 *     cc -O2 -o relay_floor benchmarks/relay_floor.c && ./relay_floor LISTEN_PORT UPSTREAM_PORT
 *
 * One thread, epoll, no parsing: each client connection accepted on 127.0.0.1:LISTEN_PORT gets a connection of its
 * own to 127.0.0.1:UPSTREAM_PORT (made as it is accepted, as a TCP relay such as socat does), TCP_NODELAY on both,
 * and every byte read on one side is written to the other at once. Either side's end closes both. benchmarks/
 * gateway_overhead.py --floor puts it beside `metralectl gateway` in the paired design: what the gateway adds beyond
 * this is its own; what this adds is what one more process and one more loopback hop cost on that machine (two
 * wake-ups of a process that slept, two more trips through the kernel), which no relay avoids.
 * It prints its port on stdout once listening; SIGINT or SIGTERM ends it.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_FDS 65536

static int peer[MAX_FDS];  /* peer[fd]: the other side's fd, -1 when fd is no relay's */
static char buffer[1 << 16];

static void nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static int listen_on(int port) {
    struct sockaddr_in at = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
    int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    inet_pton(AF_INET, "127.0.0.1", &at.sin_addr);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, (struct sockaddr *)&at, sizeof at) < 0 || listen(fd, 1024) < 0) {
        perror("relay_floor: listen");
        exit(1);
    }
    return fd;
}

static int connect_to(int port) {
    struct sockaddr_in at = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
    int fd = socket(AF_INET, SOCK_STREAM, 0);  /* blocking connect: loopback completes in the kernel */
    inet_pton(AF_INET, "127.0.0.1", &at.sin_addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&at, sizeof at) < 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    nodelay(fd);
    return fd;
}

static void close_pair(int ep, int fd) {
    int other = peer[fd];
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
    peer[fd] = -1;
    close(fd);
    if (other >= 0 && other < MAX_FDS) {
        epoll_ctl(ep, EPOLL_CTL_DEL, other, NULL);
        peer[other] = -1;
        close(other);
    }
}

static int write_all(int fd, const char *data, ssize_t size) {
    while (size > 0) {  /* the sockets are blocking for writes: a slow reader holds this relay, as it may here */
        ssize_t wrote = write(fd, data, (size_t)size);
        if (wrote < 0 && errno == EINTR) continue;
        if (wrote <= 0) return -1;
        data += wrote;
        size -= wrote;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: relay_floor LISTEN_PORT UPSTREAM_PORT (0: any free port)\n");
        return 2;
    }
    int upstream = atoi(argv[2]);
    int listener = listen_on(atoi(argv[1]));
    struct sockaddr_in bound;
    socklen_t size = sizeof bound;
    getsockname(listener, (struct sockaddr *)&bound, &size);
    for (int i = 0; i < MAX_FDS; i++) peer[i] = -1;
    signal(SIGPIPE, SIG_IGN);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = listener}, events[256];
    epoll_ctl(ep, EPOLL_CTL_ADD, listener, &ev);
    printf("%d\n", ntohs(bound.sin_port));
    fflush(stdout);
    for (;;) {
        int n = epoll_wait(ep, events, 256, -1);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return 1;
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (fd == listener) {
                int client;
                while ((client = accept4(listener, NULL, NULL, 0)) >= 0) {
                    int engine = connect_to(upstream);
                    if (engine < 0 || client >= MAX_FDS || engine >= MAX_FDS) {
                        close(client);
                        if (engine >= 0) close(engine);
                        continue;
                    }
                    nodelay(client);
                    peer[client] = engine;
                    peer[engine] = client;
                    struct epoll_event a = {.events = EPOLLIN, .data.fd = client};
                    struct epoll_event b = {.events = EPOLLIN, .data.fd = engine};
                    epoll_ctl(ep, EPOLL_CTL_ADD, client, &a);
                    epoll_ctl(ep, EPOLL_CTL_ADD, engine, &b);
                }
                continue;
            }
            if (peer[fd] < 0) continue;  /* closed earlier in this batch, with its peer */
            ssize_t got = read(fd, buffer, sizeof buffer);
            if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
            if (got <= 0 || write_all(peer[fd], buffer, got) < 0) close_pair(ep, fd);
        }
    }
}
