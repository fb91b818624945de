//! Platform code: process groups and signals. The rest of drover never calls libc directly.
