"""FedBug's headline on Fashion-MNIST with the authors' protocol (issue 17): the sweep's config,
its report and the clipping count, with the committed runs under results/ (README.md)."""
