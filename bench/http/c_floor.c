/* c_floor: the per-request floor of bench/http/driver.py.
 *
 * A minimal single-threaded epoll HTTP/1.1 responder: every request (a GET
 * without a body, ended by an empty line) is answered with the same 13-byte
 * "Hello, World!" the benchmark app sends. Keep-alive, pipelining-aware (all
 * the requests one read carries are answered with one write), nothing else:
 * no parsing beyond finding the end of each request, no Date header, no app.
 * What a server does above this is what it costs over the kernel's socket work.
 *
 *   c_floor PORT
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

#define RESPONSE "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 13\r\n\r\nHello, World!"
#define IN_SIZE 16384

struct conn {
    int fd;
    int matched;      /* how much of "\r\n\r\n" the previous read ended with */
    size_t out_len;   /* bytes of responses not yet written */
    size_t out_off;
    char *out;
    size_t out_cap;
};

static const char response[] = RESPONSE;
static const size_t response_len = sizeof(RESPONSE) - 1;

static void drop(int ep, struct conn *c) {
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    free(c->out);
    free(c);
}

/* Counts the request ends ("\r\n\r\n") in buf, carrying a partial match across reads. */
static size_t count_requests(struct conn *c, const char *buf, size_t n) {
    static const char end[] = "\r\n\r\n";
    size_t count = 0;
    int m = c->matched;
    for (size_t i = 0; i < n; i++) {
        if (buf[i] == end[m]) {
            if (++m == 4) {
                count++;
                m = 0;
            }
        } else {
            m = buf[i] == '\r' ? 1 : 0;
        }
    }
    c->matched = m;
    return count;
}

/* Writes what is pending; 0 when all of it went, 1 when the socket is full, -1 on error. */
static int flush_out(int ep, struct conn *c) {
    while (c->out_off < c->out_len) {
        ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EAGAIN) {
                struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
                epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
                return 1;
            }
            return -1;
        }
        c->out_off += (size_t)w;
    }
    c->out_len = c->out_off = 0;
    return 0;
}

static int on_readable(int ep, struct conn *c, char *buf) {
    for (;;) {
        ssize_t r = recv(c->fd, buf, IN_SIZE, 0);
        if (r == 0) return -1;
        if (r < 0) return errno == EAGAIN ? 0 : -1;
        size_t requests = count_requests(c, buf, (size_t)r);
        if (requests) {
            size_t need = c->out_len + requests * response_len;
            if (need > c->out_cap) {
                c->out_cap = need * 2;
                c->out = realloc(c->out, c->out_cap);
                if (!c->out) return -1;
            }
            for (size_t k = 0; k < requests; k++) {
                memcpy(c->out + c->out_len, response, response_len);
                c->out_len += response_len;
            }
            int f = flush_out(ep, c);
            if (f < 0) return -1;
        }
        if ((size_t)r < IN_SIZE) return 0;
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: c_floor PORT\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(argv[1]))};
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    if (bind(ls, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(ls, 4096) < 0) {
        perror("c_floor: bind/listen");
        return 1;
    }
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event lev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &lev);
    static char buf[IN_SIZE];
    struct epoll_event events[256];
    for (;;) {
        int n = epoll_wait(ep, events, 256, -1);
        for (int i = 0; i < n; i++) {
            struct conn *c = events[i].data.ptr;
            if (!c) {
                for (;;) {
                    int fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                    if (fd < 0) break;
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    struct conn *nc = calloc(1, sizeof *nc);
                    nc->fd = fd;
                    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = nc};
                    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
                }
                continue;
            }
            if (events[i].events & EPOLLOUT) {
                int f = flush_out(ep, c);
                if (f < 0) {
                    drop(ep, c);
                    continue;
                }
                if (f == 0) {
                    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
                    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
                }
            }
            if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                if (on_readable(ep, c, buf) < 0) drop(ep, c);
            }
        }
    }
}
