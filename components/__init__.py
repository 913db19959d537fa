"""Strata's Pulumi component library: cluster, Flux, operator, Stack/Program and team environments."""
