"""Drive the real pynsq client (tornado) through a publish-then-consume round trip."""

from __future__ import annotations

import asyncio
from typing import Any

import nsq


def pynsq_round_trip(
    address: str,
    topic: str,
    channel: str,
    bodies: list[bytes],
    *,
    mpub_from: int | None = None,
    max_in_flight: int = 1,
    timeout: float = 20.0,
    **conn_options: Any,
) -> tuple[list[Any], list[bytes]]:
    """PUB ``bodies`` one by one (those from ``mpub_from`` on in one MPUB) with nsq.Writer,
    then read them back with nsq.Reader; returns (publish responses, bodies received).

    ``conn_options`` (tls_v1, tls_options, snappy, deflate, auth_secret, ...) go to both."""
    singles = bodies if mpub_from is None else bodies[:mpub_from]

    async def scenario() -> tuple[list[Any], list[bytes]]:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[Any] = loop.create_future()

        class Writer(nsq.Writer):  # type: ignore[misc]
            def _on_connection_ready(self, conn: Any, **kwargs: Any) -> None:
                super()._on_connection_ready(conn, **kwargs)
                if not ready.done():
                    ready.set_result(conn)

        writer = Writer([address], **conn_options)
        await ready
        responses = []
        for body in singles:
            fut: asyncio.Future[Any] = loop.create_future()
            writer.pub(
                topic, body, callback=lambda conn, data, f=fut: f.done() or f.set_result(data)
            )
            responses.append(await fut)
        if mpub_from is not None:
            fut = loop.create_future()
            writer.mpub(
                topic,
                bodies[mpub_from:],
                callback=lambda conn, data, f=fut: f.done() or f.set_result(data),
            )
            responses.append(await fut)
        received: list[bytes] = []
        done = loop.create_future()

        def handler(message: nsq.Message) -> bool:
            received.append(message.body)
            if len(received) == len(bodies) and not done.done():
                done.set_result(None)
            return True

        reader = nsq.Reader(
            topic=topic,
            channel=channel,
            nsqd_tcp_addresses=[address],
            message_handler=handler,
            max_in_flight=max_in_flight,
            **conn_options,
        )
        await done
        reader.close()
        for conn in list(writer.conns.values()):
            conn.close()
        return responses, received

    async def main() -> tuple[list[Any], list[bytes]]:
        return await asyncio.wait_for(scenario(), timeout)

    return asyncio.run(main())
