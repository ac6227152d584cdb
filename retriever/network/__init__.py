"""Privacy-preserving retrieval network: contributors release DP synthetic knowledge once
(`knowledge`, `folder`), serve it (`dpsynth.service.contributor`: the service's app over
a knowledge folder), and a `NetworkQueryEngine` (`engine`) fans questions out to them and
merges what comes back."""
