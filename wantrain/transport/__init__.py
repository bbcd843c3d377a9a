"""What crosses the WAN between a site and the PS, and how. The domain messages (`messages.py`) and
a delta's manifest (`manifest.py`, with the tensor roles it names, `roles.py`); the order a delta's
chunks go out in and their protection (`sending.py`, XOR parity `parity.py`); the one place that
turns them into protobuf and back and checks what arrives (`wire.py`, over the generated `proto/`);
every gRPC channel and server (`net.py`); tokens and TLS (`auth.py`, `tls.py`); and the bounds on
what a peer may make the PS do (`limits.py`)."""
