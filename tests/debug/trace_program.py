"""A program with two graph breaks and a recompile, for the trace directory's tests
(its own module so that line numbers are stable)."""
import torch


def two_breaks(x, y):
    a = x.sin() + y
    print("kiln trace test: first break")
    b = a.cos() * 2
    print("kiln trace test: second break")
    return (b + 1).relu()


def run(compiled):
    """Call twice with different batch sizes (the second call recompiles); the results
    beside eager's."""
    outs = []
    for n in (4, 8):
        x, y = torch.randn(n, 3), torch.randn(n, 3)
        outs.append((compiled(x, y), two_breaks(x, y)))
    return outs


def line_of(text: str) -> int:
    """The line number of the first line of this file containing ``text``."""
    with open(__file__) as f:
        for i, line in enumerate(f, 1):
            if text in line:
                return i
    raise ValueError(text)


if __name__ == "__main__":
    import kiln

    for got, want in run(kiln.compile(two_breaks)):
        torch.testing.assert_close(got, want)
    print("ok")
