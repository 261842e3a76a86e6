"""The wire: addresses, secrets and the handshake, frames, the msgpack codec, framed connections.
Knows nothing of actors, supervision or the tensor channel above it."""
