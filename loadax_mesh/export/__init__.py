"""The plan and its recipe in other trainers' terms (docs/design.md section 9): MaxText's config
keys, AXLearn's mesh_shape and mesh_rules entry, Flax's logical axis rules."""
