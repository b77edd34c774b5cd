"""What a machine is: the catalogue, hardware strings and their simulation, one normal form of
a device, detection, and compile-only devices (libtpu, XLA's CUDA client)."""
