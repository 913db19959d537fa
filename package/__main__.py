"""The strata component package's provider plugin, started by the Pulumi Python language host."""

from strata_components.package import serve

if __name__ == "__main__":
    serve()
