"""The abort of uvloop 0.23.0 (libuv 1.52.1) reduced to a few lines: a descriptor the loop
watches is closed behind its back, then watched for another event. asyncio's loop raises
``OSError(EBADF)``; uvloop's aborts the process (``Fatal Python error: Aborted``, status 134)
in ``uv__epoll_ctl_flush``. See docs/reliability.md, "The event loop".

    python -m bench.uvloop_fd_abort asyncio   # prints the OSError, exits 0
    python -m bench.uvloop_fd_abort uvloop    # aborts
"""

import asyncio
import os
import socket
import sys


async def main() -> None:
    loop = asyncio.get_running_loop()
    a, _b = socket.socketpair()
    fd = a.fileno()
    loop.add_reader(fd, lambda: None)  # EPOLL_CTL_ADD, flushed at the next poll
    await asyncio.sleep(0.01)
    os.close(fd)  # closed without telling the loop
    a.detach()
    try:
        loop.add_writer(fd, lambda: None)  # a new event mask: EPOLL_CTL_MOD of a closed fd
        await asyncio.sleep(0.01)
    except OSError as err:
        print(f"{type(loop).__module__}: {err!r}")


if __name__ == "__main__":
    if sys.argv[1:] == ["uvloop"]:
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())
