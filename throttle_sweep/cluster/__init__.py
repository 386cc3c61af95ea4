"""The execution layer: engine slots (this machine's threads, or Ray actors), the engine processes they keep warm,
Ray itself, and Ctrl-C around work that must not be cut in half."""
