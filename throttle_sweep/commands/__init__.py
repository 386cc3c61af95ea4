"""One function per mode: turn the composed config into checked objects and call the core modules."""
