"""The pure core: specs, the sans-IO supervisor, restart intensity, exit reasons, the event
vocabulary, actors' programming model, shapes and value meshes. Imports neither trio nor sockets
(tests/test_layers.py checks it): every rule here is tested in microseconds, deterministically."""
