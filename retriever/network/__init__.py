"""Privacy-preserving retrieval network: contributors release DP synthetic knowledge once
(`knowledge`, `folder`), serve it (`contributor`), and a `NetworkQueryEngine` (`engine`)
fans questions out to them and merges what comes back."""
