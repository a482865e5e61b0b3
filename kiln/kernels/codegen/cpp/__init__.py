"""C++/OpenMP source for CPU graphs (one shared library per graph)."""
