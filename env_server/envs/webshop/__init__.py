"""WebShop, implemented for limen: catalog, BM25 search, goals, reward, text pages, web site and browser
mode. The env is `env.WebShopEnv` (registered as "webshop"); see README.md here."""
