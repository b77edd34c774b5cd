"""Device ordering: torus rings inside a granule (torus.py), granules into a mesh (hybrid.py)."""
