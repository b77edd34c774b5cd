"""What the compiler says (docs/design.md section 7): compile_step and its report, the optimised
HLO read (loops, collectives, replica groups), FLOPs per loop trip, bytes inside and across
hosts, and the simulation checked against the compile-only devices."""
