"""Loopback ports for the test servers (imported by the serve, dist, kvq
and chat_page tests).

A port the kernel hands out for bind(0) comes from its ephemeral range,
which is also where every outgoing connection and mpirun's own listeners
take theirs: between closing the probe and the server binding it, another
process of the suite can take it ("Address already in use", seen once in
dist_serve_pp). So the port is drawn at random below that range, where
nothing is given out on its own, and tried before it is returned.
"""
import random
import socket


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port():
    high = min(_ephemeral_low(), 65536)
    low = 10000 if high > 12000 else 1024
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(low, high)
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
            return port
        except OSError:
            continue
        finally:
            s.close()
    raise RuntimeError("no free loopback port below %d" % high)
